"""What keeping the bucket prefixes costs a push group (PROTOCOL §18, revision 0012).

`relay.store.push` reads `vaults.bucket_prefixes` and `bucket_counts` with the locked vault
row (`_READ_VAULTS`), applies the group's changes in Python and writes both back in
`_UPDATE_VAULT`. Two variants of the same module, made from its source here, run against
it on one database with rounds alternating (bench.push_groups.measure, one new blob per
vault and push, groups of 1, 8, 32 and 128 vaults):

- `without`: neither column read nor written (the push as before revision 0012; the
  Python per-blob part stays, bench/anti_entropy.py measures that);
- `in_sql`: not read; `_UPDATE_VAULT` XORs the changed buckets' 8 bytes and adds their
  counts in SQL (the touched buckets, XORs and counts as three arrays).

Alone: `python -m bench.bucket_prefix_push [--rounds N]` (its own embedded PostgreSQL).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import inspect
import json
import sys
from types import ModuleType
from typing import Any, cast

import asyncpg

from bench import push_groups
from bench.corpus import Corpus
from engram_sync.relay.store import digest, push
from engram_sync.shared_format.digest import bucket_prefixes

_READ = '    " v.bucket_prefixes, v.bucket_counts,"  # PROTOCOL §18, revision 0012\n'
_LOCKED = """            bucket_prefixes=r["bucket_prefixes"],
            bucket_counts=r["bucket_counts"],
"""
_UPDATE = '" digest = $6, bucket_prefixes = $7, bucket_counts = $8 WHERE vault_id = $1"'
_APPLY = """                *apply_changes(v.bucket_prefixes, v.bucket_counts, v.bucket_xors,
                               v.bucket_added),  # PROTOCOL §18, revision 0012
"""
_IN_SQL = (
    '" digest = $6, bucket_prefixes = (SELECT string_agg(CASE WHEN d.x IS NULL'
    " THEN substr(vaults.bucket_prefixes, 8 * s.b + 1, 8) ELSE int8send(('x' || encode("
    "substr(vaults.bucket_prefixes, 8 * s.b + 1, 8), 'hex'))::bit(64)::bigint # d.x) END,"
    " ''::bytea ORDER BY s.b) FROM generate_series(0, 255) AS s(b)"
    " LEFT JOIN unnest($7::int4[], $8::int8[]) AS d(b, x) ON d.b = s.b),"
    " bucket_counts = (SELECT string_agg(int4send(('x' || encode(substr(vaults.bucket_counts,"
    " 4 * s.b + 1, 4), 'hex'))::bit(32)::int + coalesce(d.n, 0)), ''::bytea ORDER BY s.b)"
    " FROM generate_series(0, 255) AS s(b)"
    " LEFT JOIN unnest($7::int4[], $9::int4[]) AS d(b, n) ON d.b = s.b)"
    ' WHERE vault_id = $1"'
)
_SQL_ARGS = """                list(v.bucket_xors),
                [x - (1 << 64) if x >> 63 else x for x in v.bucket_xors.values()],
                [v.bucket_added.get(b, 0) for b in v.bucket_xors],
"""


def _variant(name: str, replacements: list[tuple[str, str]]) -> ModuleType:
    source = inspect.getsource(push)
    for old, new in replacements:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)  # noqa: S102 - our own source
    return module


def variants() -> list[tuple[str, push_groups.PushGroup]]:
    without = _variant(
        "bench_push_without_prefixes",
        [
            (_READ, ""),
            (_LOCKED, ""),
            (_UPDATE, '" digest = $6 WHERE vault_id = $1"'),
            (_APPLY, ""),
        ],
    )
    in_sql = _variant(
        "bench_push_prefixes_in_sql",
        [(_READ, ""), (_LOCKED, ""), (_UPDATE, _IN_SQL), (_APPLY, _SQL_ARGS)],
    )
    return [
        ("stored_read", push.push_group),
        ("without", without.push_group),
        ("in_sql", in_sql.push_group),
    ]


async def agree(url: str, sizes: tuple[int, ...] = push_groups.GROUP_VAULTS) -> bool:
    """Whether both writing variants left every vault's stored prefixes and counts equal
    to the grouped computation over its rows (the `without` variant writes neither)."""
    conn = await asyncpg.connect(url)
    try:
        for name in ("stored_read", "in_sql"):
            for size in sizes:
                vault_id = f"group-{name}-{size}-000"
                mine = await digest.stored_buckets(cast("asyncpg.Pool", conn), vault_id)
                _, found = await digest.bucket_digests(cast("asyncpg.Pool", conn), vault_id, None)
                computed = bucket_prefixes({b: d.digest for b, d in found.items()})
                counts = [found[b].count if b in found else 0 for b in range(256)]
                if (mine.prefixes, mine.counts) != (computed, counts) or not found:
                    return False
        return True
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    from bench.database import BenchDatabase

    parser = argparse.ArgumentParser(prog="python -m bench.bucket_prefix_push")
    parser.add_argument("--rounds", type=int, default=push_groups.ROUNDS)
    args = parser.parse_args(argv)
    corpus = Corpus.make(2_000)
    with BenchDatabase() as db:
        result: dict[str, Any] = asyncio.run(
            push_groups.measure(db.url, corpus, rounds=args.rounds, pushes=variants())
        )
        result["variants_agree_with_rows"] = asyncio.run(agree(db.url))
    print(json.dumps(result, indent=2))
    for point in result["points"]:
        base = point["without_ms"]
        print(
            f"{point['vaults']:>4} vaults: without {base:.2f} ms, read in the vault row "
            f"{point['stored_read_ms']:.2f} ms ({point['stored_read_ms'] / base - 1:+.1%}), "
            f"in SQL {point['in_sql_ms']:.2f} ms ({point['in_sql_ms'] / base - 1:+.1%})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
