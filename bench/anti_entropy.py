"""Figure 12, anti-entropy (PROTOCOL §18, docs/digest.md, issue 16).

1. Finding one divergent memory in a vault of 1,000,000 memories (20,000 with
   `--quick`): the vault's relay rows are written straight in SQL (as figure 4 fills its
   large vault), and a device holding every version of it but one asks the relay over
   HTTP with the client's own narrowing (`client._sync.anti_entropy.AntiEntropy.locate`:
   the vault digest, `?buckets=1`, then `POST .../digest/narrow` for the bucket that
   differs). Counted: round trips, and bytes on the wire in both directions (request
   line, headers and body out; status line, headers and body in; HTTP/1.1 over loopback,
   no TLS), next to the JSON bodies alone.
2. What keeping the digest costs a push: the relay's blob upsert into `blobs` (with the
   `digest_bucket` column the push writes and its index, revision 0010) against the same
   statement without that column into a copy of the table without column and index,
   batches of 500, a warm-up round first and the order alternating; plus the push path's
   Python work per blob (the bucket, two SHA-256 version hashes and the bucket prefix's
   XOR and count, revision 0012) against the relay push time per blob measured in
   figure 2.
3. `?buckets=1`: the stored prefixes and counts (revision 0012, one row read) against
   the grouped pass over the vault's rows it was before (`relay.store.digest._BUCKETS`,
   timed once: 139 s for 1,000,000 rows).

Alone: `python -m bench.anti_entropy [--quick] [--vault N] [--blobs N] [--repeats N]` (its
own embedded PostgreSQL and relay process; prints the JSON and PASS/FAIL lines; `--quick`:
20,000 memories and blobs).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import asyncpg
import httpx

from bench import ceiling
from bench.corpus import Corpus
from bench.stats import summary
from engram_sync.client._sync.anti_entropy import AntiEntropy
from engram_sync.client._sync.engine import SyncReport
from engram_sync.client._sync.relay_client import RelayClient
from engram_sync.relay.store import digest as digest_store
from engram_sync.relay.store.bucket_prefixes import PREFIX_SHIFT
from engram_sync.relay.store.push import BLOB_UPSERT
from engram_sync.shared_format.digest import Version, bucket_of, version_hash

if TYPE_CHECKING:
    from bench.runner import Run
    from engram_sync.client._sync.engine import Syncer

FIND_VAULT_FULL = 1_000_000
FIND_VAULT_QUICK = 20_000
FIND_ROUND_TRIPS = 3  # issue 16 (bench.targets has the same)
FIND_BYTES = 16 * 1024
PUSH_OVERHEAD = 0.02

# Raw-SQL fills bypass the push path: set the vault's digest, counts and sequence from its
# rows, as revision 0008's backfill does.
_RECOMPUTE = f"""
UPDATE vaults SET digest = int8send(x.w0) || int8send(x.w1) || int8send(x.w2) || int8send(x.w3),
    live_blobs = x.live, tombstones = x.dead, seq = x.seq
FROM (SELECT {digest_store.XOR_WORDS}, count(*) FILTER (WHERE NOT deleted) AS live,
             count(*) FILTER (WHERE deleted) AS dead, coalesce(max(seq), 0) AS seq
      FROM (SELECT deleted, seq,
                   engram_version_hash(memory_id, device_id, vector_clock, deleted) AS v
            FROM blobs WHERE vault_id = $1) h) x
WHERE vault_id = $1
"""  # noqa: S608 - constants only
# PROTOCOL §18: and its stored bucket prefixes and counts, by revision 0012's own backfill
_BACKFILL = importlib.import_module(
    "engram_sync.relay.migrations.versions.0012_bucket_prefixes"
).backfill("vault_id = $1")
# One chunk of the 1,000,000-memory vault, straight in SQL: memory i is `ae-<i>`, clock i.
_FILL = """
INSERT INTO blobs (vault_id, memory_id, device_id, vector_clock, ciphertext, hmac, created_at,
                   created_at_ts, deleted, seq, size_bytes, digest_bucket)
SELECT $1, 'ae-' || lpad(i::text, 7, '0'), 'bench-device', i, 'c', 'h',
       '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', false, i, 1,
       engram_digest_bucket('ae-' || lpad(i::text, 7, '0'))
FROM generate_series($2::bigint, $3::bigint) AS i
ON CONFLICT DO NOTHING
"""
_FILL_CHUNK = 100_000
_CLONE = "bench_blobs_without_digest"
_COLUMN_ONLY = "bench_blobs_column_only"  # the bucket column, not its index


def find_vault_id(blobs: int) -> str:
    return f"anti-entropy-{blobs}"


def vault_versions(blobs: int) -> list[Version]:
    """The versions `_FILL` writes, as a device holding all of them sees them."""
    return [Version(f"ae-{i:07d}", "bench-device", i, False) for i in range(1, blobs + 1)]


async def build_vault(conn: asyncpg.Connection, blobs: int) -> str:
    """The vault of `blobs` memories in SQL (kept if already there), its digest set."""
    vault_id = find_vault_id(blobs)
    await conn.execute("INSERT INTO vaults (vault_id) VALUES ($1) ON CONFLICT DO NOTHING", vault_id)
    for first in range(1, blobs + 1, _FILL_CHUNK):
        await conn.execute(_FILL, vault_id, first, min(first + _FILL_CHUNK - 1, blobs))
    await conn.execute(_RECOMPUTE, vault_id)
    await conn.execute(_BACKFILL, vault_id)
    await conn.execute("ANALYZE blobs")
    return vault_id


class WireCounter(httpx.BaseTransport):
    """An HTTP transport counting the bytes of each exchange as HTTP/1.1 sends them."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.sent = 0
        self.received = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        target = request.url.raw_path.decode()
        self.sent += len(f"{request.method} {target} HTTP/1.1\r\n\r\n")
        self.sent += sum(len(k) + len(v) + 4 for k, v in request.headers.raw)
        self.sent += len(request.content)
        response = self.inner.handle_request(request)
        response.read()
        self.received += len(f"HTTP/1.1 {response.status_code} OK\r\n\r\n")
        self.received += sum(len(k) + len(v) + 4 for k, v in response.headers.raw)
        self.received += len(response.content)
        return response

    def close(self) -> None:
        self.inner.close()


class _Probe:
    """What AntiEntropy.locate needs of a Syncer: the relay, the vault id, and the sync
    state's blobs refused on pull (none here)."""

    def __init__(self, relay: RelayClient, vault_id: str) -> None:
        self.relay = relay
        self.vault_id = vault_id
        self.state = SimpleNamespace(skipped=[])


def find_one(url: str, key: str, vault_id: str, held: list[Version]) -> dict[str, Any]:
    """A device that lacks the last version of `held`: how it finds it."""
    missing = held[-1]
    device = held[:-1]
    wire = WireCounter()
    # the client's default timeout (30 s): `?buckets=1` is stored since revision 0012 (it
    # was a grouped pass over the vault's rows, 139 s for 1,000,000: bucket_reads)
    with RelayClient(url, key, transport=wire) as relay:
        relay.offers("digest")  # /v1/info is asked once per client, before any check
        before = wire.sent + wire.received
        probe = AntiEntropy(cast("Syncer", _Probe(relay, vault_id)), SyncReport())
        started = time.perf_counter()
        plan = probe.locate(device)
        seconds = time.perf_counter() - started
    result = probe.result
    found = plan is not None and plan[0] == [missing.memory_id] and plan[1] == []
    return {
        "vault_blobs": len(held),
        "round_trips": result.round_trips,
        "wire_bytes": wire.sent + wire.received - before,
        "json_bytes": result.answer_bytes + result.request_bytes,
        "answer_bytes": result.answer_bytes,
        "buckets_listed": len(result.buckets),
        "found": found,
        "seconds": seconds,
    }


async def _clone(conn: asyncpg.Connection) -> None:
    for table in (_CLONE, _COLUMN_ONLY):
        await conn.execute(f"DROP TABLE IF EXISTS {table}")
        await conn.execute(
            f"CREATE TABLE {table} (LIKE blobs INCLUDING DEFAULTS INCLUDING INDEXES)"
        )
        await conn.execute(  # LIKE copies no foreign key: the same check as blobs makes
            f"ALTER TABLE {table} ADD FOREIGN KEY (vault_id) REFERENCES vaults (vault_id)"
            " ON DELETE CASCADE"
        )
    await conn.execute(f"ALTER TABLE {_CLONE} DROP COLUMN digest_bucket")  # and its index
    index = await conn.fetchval(
        "SELECT indexname FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%digest_bucket%'",
        _COLUMN_ONLY,
    )
    await conn.execute(f'DROP INDEX "{index}"')


def without_digest_statement() -> str:
    """BLOB_UPSERT into the copy, without the digest_bucket column and its array."""
    statement = BLOB_UPSERT.replace("INSERT INTO blobs", f"INSERT INTO {_CLONE}", 1)
    # The column list and the unnest alias list, the select list, the array.
    statement = statement.replace(", size_bytes, digest_bucket)", ", size_bytes)")
    statement = statement.replace(", u.size_bytes, u.digest_bucket", ", u.size_bytes", 1)
    statement = statement.replace(", $12::smallint[])", ")", 1)
    assert "digest_bucket" not in statement
    assert "$12" not in statement
    return statement


async def _write(
    conn: asyncpg.Connection, statement: str, prepared: ceiling.Prepared, *, columns: int
) -> float:
    await conn.execute(
        "INSERT INTO vaults (vault_id) VALUES ($1) ON CONFLICT DO NOTHING", prepared.vault_id
    )
    started = time.perf_counter()
    for cols in prepared.batches:
        await conn.execute(statement, *cols[:columns])
    return time.perf_counter() - started


def python_seconds_per_blob(corpus: Corpus, blobs: int, *, prefixes: bool = True) -> float:
    """The push path's digest work per blob: the old version out, the new one in, the
    bucket (for the column and the prefix) and the bucket prefix's XOR (revision 0012;
    relay.store.push._decide: a replacement, so no count; a new memory counts one instead
    of the second hash). CPU time of this process (time.process_time), so other processes
    on a loaded machine do not inflate it. `prefixes=False`: the same without the prefix's
    XOR, as before revision 0012."""
    ids = [corpus.memory_id(i) for i in range(blobs)]
    started = time.process_time()
    value = 0
    xors: dict[int, int] = {}
    buckets = []
    for i, memory_id in enumerate(ids):
        bucket = bucket_of(memory_id)
        buckets.append(bucket)
        change = version_hash(memory_id, "bench-device", i + 1, False)
        change ^= version_hash(memory_id, "bench-device", i, False)
        value ^= change
        if prefixes:
            xors[bucket] = xors.get(bucket, 0) ^ (change >> PREFIX_SHIFT)
    assert len(buckets) == blobs
    return (time.process_time() - started) / blobs


async def write_overhead(
    conn: asyncpg.Connection, corpus: Corpus, *, blobs: int, repeats: int, batch: int
) -> dict[str, Any]:
    """Upsert seconds into `blobs`, into the copy without the digest column, and into the
    copy with the column but not its index (where the cost is); the order rotates."""
    await _clone(conn)
    without = without_digest_statement()
    column_only = BLOB_UPSERT.replace("INSERT INTO blobs", f"INSERT INTO {_COLUMN_ONLY}", 1)
    with_s: list[float] = []
    without_s: list[float] = []
    column_s: list[float] = []
    try:
        for r in range(repeats + 1):  # repeat 0 warms the tables up, unmeasured
            order = [
                ("with", BLOB_UPSERT, 12, with_s),
                ("without", without, 11, without_s),
                ("column", column_only, 12, column_s),
            ]
            for name, statement, columns, into in order[r % 3 :] + order[: r % 3]:
                prepared = ceiling.prepare(
                    corpus, f"digest-cost-{name}-{r}", count=blobs, batch=batch
                )
                seconds = await _write(conn, statement, prepared, columns=columns)
                if r > 0:
                    into.append(seconds)
    finally:
        for table in (_CLONE, _COLUMN_ONLY):
            await conn.execute(f"DROP TABLE IF EXISTS {table}")
    return {
        "blobs": blobs,
        "batch": batch,
        "with_s": with_s,
        "without_s": without_s,
        "column_only_s": column_s,
    }


async def bucket_reads(conn: asyncpg.Connection, vault_id: str) -> dict[str, Any]:
    """The relay's bucket statements on the vault's busiest bucket: whether their plans use
    the index (vault_id, digest_bucket) or scan blobs (EXPLAIN), and how long each takes
    (median of 3, ms): a narrowing, a list page from the middle of the bucket, one
    bucket's digest, and every bucket's (`?buckets=1`): stored (revision 0012) and, once,
    the grouped pass over the vault's rows it was before."""
    bucket = await conn.fetchval(
        "SELECT digest_bucket FROM blobs WHERE vault_id = $1 GROUP BY digest_bucket"
        " ORDER BY count(*) DESC LIMIT 1",
        vault_id,
    )
    middle = await conn.fetchval(
        "SELECT memory_id FROM blobs WHERE vault_id = $1 AND digest_bucket = $2"
        " ORDER BY memory_id OFFSET (SELECT count(*) / 2 FROM blobs"
        " WHERE vault_id = $1 AND digest_bucket = $2) LIMIT 1",
        vault_id,
        bucket,
    )
    statements = {
        "narrow": (digest_store._NARROW, [vault_id, bucket, bytes(2048), "", 2000]),
        "list_page": (digest_store._LIST, [vault_id, bucket, middle, 2000]),
        "one_bucket": (digest_store._BUCKETS, [vault_id, bucket]),
        "every_bucket": (digest_store._BUCKET_PREFIXES, [vault_id]),  # `?buckets=1`
        "every_bucket_computed": (digest_store._BUCKETS, [vault_id, None]),  # before 0012
    }
    found: dict[str, Any] = {"bucket": bucket}
    for name, (sql, args) in statements.items():
        plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN {sql}", *args))
        took = []
        for _ in range(1 if name == "every_bucket_computed" else 3):
            started = time.perf_counter()
            await conn.fetch(sql, *args)
            took.append((time.perf_counter() - started) * 1e3)
        found[name] = {
            "uses_bucket_index": "blobs_digest_bucket_idx" in plan,
            "scans_blobs": "Seq Scan on blobs" in plan,
            "ms": statistics.median(took),
        }
    return found


async def _find_vault(conn: asyncpg.Connection, blobs: int, log: Callable[[str], None]) -> str:
    started = time.perf_counter()
    vault_id = await build_vault(conn, blobs)
    log(f"anti-entropy: vault of {blobs:,} memories written in SQL in "
        f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    return vault_id


def measure_parts(
    loop: asyncio.Runner,
    conn: asyncpg.Connection,
    relay: tuple[str, str],
    corpus: Corpus,
    *,
    vault_blobs: int,
    upsert_blobs: int,
    repeats: int,
    push_blobs_per_s: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Figure 12 on a database and relay (url, key) already running."""
    vault_id = loop.run(_find_vault(conn, vault_blobs, log))
    reads = loop.run(bucket_reads(conn, vault_id))
    held = vault_versions(vault_blobs)
    log(f"anti-entropy: one divergent memory in a vault of {len(held):,} memories")
    finds = [find_one(relay[0], relay[1], vault_id, held) for _ in range(repeats)]
    del held
    log(f"anti-entropy: upsert cost with and without the digest column, {upsert_blobs} blobs")
    cost = loop.run(write_overhead(conn, corpus, blobs=upsert_blobs, repeats=repeats, batch=500))
    python_s = python_seconds_per_blob(corpus, min(upsert_blobs, 20_000))
    python_before_s = python_seconds_per_blob(corpus, min(upsert_blobs, 20_000), prefixes=False)
    database = [w / wo - 1 for w, wo in zip(cost["with_s"], cost["without_s"], strict=True)]
    python_share = python_s * push_blobs_per_s  # of the time one blob's push takes
    per_blob_us = [
        (w - wo) / upsert_blobs * 1e6
        for w, wo in zip(cost["with_s"], cost["without_s"], strict=True)
    ]
    return {
        "vault_blobs": vault_blobs,
        "round_trips": summary([float(f["round_trips"]) for f in finds], "round trips"),
        "wire_bytes": summary([float(f["wire_bytes"]) for f in finds], "bytes"),
        "json_bytes": summary([float(f["json_bytes"]) for f in finds], "bytes"),
        "answer_bytes": summary([float(f["answer_bytes"]) for f in finds], "bytes"),
        "found": all(f["found"] for f in finds),
        "find_s": summary([f["seconds"] for f in finds], "s"),
        "bucket_reads": reads,
        "upsert_blobs": upsert_blobs,
        "upsert_with_s": summary(cost["with_s"], "s"),
        "upsert_without_s": summary(cost["without_s"], "s"),
        "upsert_column_only_s": summary(cost["column_only_s"], "s"),
        "column_only_overhead": summary(
            [c / wo - 1 for c, wo in zip(cost["column_only_s"], cost["without_s"], strict=True)],
            "x",
        ),
        "database_overhead": summary(database, "x"),
        "database_us_per_blob": summary(per_blob_us, "us"),
        "python_us_per_blob": python_s * 1e6,
        "python_us_per_blob_without_prefixes": python_before_s * 1e6,  # before revision 0012
        "python_overhead": python_share,
        "push_overhead": statistics.median(database) + python_share,
    }


def measure(run: Run, push_blobs_per_s: float) -> dict[str, Any]:
    """Figure 12 inside `python -m bench`: the find on a vault of 1,000,000 memories
    (20,000 quick), the upsert cost at the run's full size."""
    with run.monitor.phase("digest_cost"):
        return measure_parts(
            run.loop,
            run.conn,
            (run.relay.url, run.relay.key),
            run.corpus,
            vault_blobs=FIND_VAULT_QUICK if run.s.quick else FIND_VAULT_FULL,
            upsert_blobs=run.s.n,
            repeats=run.s.repeats,
            push_blobs_per_s=push_blobs_per_s,
            log=run.log,
        )


def verdicts(d: dict[str, Any]) -> list[str]:
    """PASS/FAIL lines of figure 12 (bench.targets judges the same in the full report)."""
    trips, wire = d["round_trips"]["median"], d["wire_bytes"]["median"]
    return [
        f"{'PASS' if trips <= FIND_ROUND_TRIPS and d['found'] else 'FAIL'}: one divergent memory "
        f"in {d['vault_blobs']:,} memories {'found' if d['found'] else 'NOT found'} in "
        f"{trips:g} round trips (<= {FIND_ROUND_TRIPS})",
        f"{'PASS' if wire <= FIND_BYTES else 'FAIL'}: {wire:,.0f} bytes on the wire both ways "
        f"(<= {FIND_BYTES:,}; JSON bodies alone {d['json_bytes']['median']:,.0f})",
        f"{'PASS' if d['push_overhead'] <= PUSH_OVERHEAD else 'FAIL'}: push cost of the digest "
        f"{d['push_overhead']:+.1%} (<= {PUSH_OVERHEAD:.0%}): database "
        f"{d['database_overhead']['median']:+.1%} (median of "
        f"{', '.join(f'{v:+.1%}' for v in d['database_overhead']['values'])}), "
        f"hashing {d['python_us_per_blob']:.2f} us/blob = {d['python_overhead']:.1%}; the "
        f"column without its index {d['column_only_overhead']['median']:+.1%}",
    ]


def main(argv: list[str] | None = None) -> int:
    """Figure 12 alone, on its own embedded PostgreSQL and relay process."""
    from bench.database import BenchDatabase
    from bench.relay_process import RelayProcess

    parser = argparse.ArgumentParser(prog="python -m bench.anti_entropy")
    parser.add_argument("--vault", type=int, default=FIND_VAULT_FULL, help="memories to search")
    parser.add_argument("--blobs", type=int, default=100_000, help="blobs per upsert round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--quick", action="store_true", help=f"{FIND_VAULT_QUICK:,} memories and blobs"
    )
    parser.add_argument(
        "--push-us", type=float, default=90.0, help="figure 2's relay push time per blob (us)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.vault = args.blobs = FIND_VAULT_QUICK

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    corpus = Corpus.make(args.blobs)
    with BenchDatabase() as db:
        key = "bench-" + secrets.token_urlsafe(24)
        with (
            RelayProcess(db.url, key, db.scratch / "relay.log") as relay,
            asyncio.Runner() as loop,
        ):
            conn = loop.run(ceiling.connect(db.url))
            try:
                result = measure_parts(
                    loop, conn, (relay.url, key), corpus, vault_blobs=args.vault,
                    upsert_blobs=args.blobs, repeats=args.repeats,
                    push_blobs_per_s=1e6 / args.push_us, log=log,
                )  # fmt: skip
            finally:
                loop.run(conn.close())
    print(json.dumps(result, indent=2))
    for line in verdicts(result):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
