"""Figure 12, push throughput: the push with the digest kept against the push as it was
before the digest (PROTOCOL §18, docs/digest.md, issue 16: "within 2% of before").

Two relay processes on two new databases of the run's server, both migrated to head:

- `with`: the relay as it is (`engram-relay serve`'s code);
- `before`: the same relay with `relay.store.push` made from its own source without the
  digest (`before_source`: no bucket, no version hash, no vault digest, bucket prefixes
  or counts read or written), on a database whose `vaults` has no digest columns: the
  push and its tables before revisions 0008 and 0012 (`blobs` is as it was before 0008
  again since revision 0014).

Each round pushes the same N blobs, batches of 500 over HTTP one after the other like
figure 2, to a new vault of each relay (the order alternating), then the same memories
again with clocks one higher (every blob replacing one: the XOR out as well as in). The
figure is the median over rounds of (with / before - 1) of the round's seconds; a warm-up
round first. At the end the `with` relay's vault digests must equal the client's fold of
what was pushed, and the `before` relay's the empty digest (it kept none).

Alone: `python -m bench.digest_push [--blobs N] [--rounds N]` (its own embedded
PostgreSQL). The `before` relay's child: `python -m bench.digest_push --serve-before`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import inspect
import json
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import asyncpg
import httpx
import msgspec

from bench.corpus import Corpus
from bench.relay_load import headers, push_all
from bench.stats import summary
from engram_sync.shared_format.digest import Version, digest_text, fold
from engram_sync.shared_format.wire import PushRequest, encode_json

if TYPE_CHECKING:
    from bench.database import BenchDatabase

PUSH_MODULE: Final = "engram_sync.relay.store.push"
BATCH: Final = 500  # figure 2's batch
OVERHEAD: Final = 0.02  # issue 16 (bench.targets has the same)
DEVICE: Final = "bench-pusher"

# What `before_source` takes out of relay.store.push, each (text, replacement, times):
# every one must be found exactly so often, so a change of push.py that moves one fails
# the bench (and its quick run in CI) rather than measuring something else.
_WITHOUT_DIGEST: Final[list[tuple[str, str, int]]] = [
    # the vault row without its digest, bucket prefixes and counts
    (' v.tombstones, v.digest,"', ' v.tombstones,"', 1),
    ('    " v.bucket_prefixes, v.bucket_counts,"  # PROTOCOL §18, revision 0012\n', "", 1),
    (
        "           v.digest, v.bucket_prefixes, v.bucket_counts,"
        "  -- PROTOCOL §18, revision 0012\n",
        "",
        1,
    ),
    ("           NULL, NULL, NULL,  -- the digest, bucket prefixes and counts\n", "", 1),
    (
        '            digest=digest_int(r["digest"]),\n'
        '            bucket_prefixes=r["bucket_prefixes"],\n'
        '            bucket_counts=r["bucket_counts"],\n',
        "",
        1,
    ),
    (
        ' tombstones = $5,"\n    " digest = $6, bucket_prefixes = $7, bucket_counts = $8'
        ' WHERE vault_id = $1"',
        ' tombstones = $5"\n    " WHERE vault_id = $1"',
        1,
    ),
    # the vault rows sent with COMMIT (plain PostgreSQL, issue 36)
    (
        '        f" live_blobs = {int(v.live_blobs)}, tombstones = {int(v.tombstones)},"\n'
        '        f" digest = {hex_bytea(digest_bytes(v.digest))},"\n'
        '        f" bucket_prefixes = {hex_bytea(v.bucket_prefixes)},"\n'
        '        f" bucket_counts = {hex_bytea(v.bucket_counts)}"  # PROTOCOL §18, revision 0012\n',
        '        f" live_blobs = {int(v.live_blobs)}, tombstones = {int(v.tombstones)}"\n',
        1,
    ),
    (
        "        digest_bytes(v.digest),\n"
        "        v.bucket_prefixes, v.bucket_counts,  # PROTOCOL §18, revision 0012\n",
        "",
        1,
    ),
    # no hashing: no versions kept to fold, the write awaited alone (the reads still
    # overlap §6 step 1's check, as in the relay: issue 36)
    ("            vault.versions.append((blob, replaced))\n", "", 1),
    (
        "        await while_answered(statement, lambda: _fold_digests(vaults))\n",
        "        await statement\n",
        1,
    ),
    (
        "    await while_answered(\n"
        "        conn.executemany(BLOB_UPSERT, [blob_columns(rows[v.vault_id]) for v in vaults]),\n"
        "        lambda: _fold_digests(vaults),\n"
        "    )\n",
        "    await conn.executemany(BLOB_UPSERT, [blob_columns(rows[v.vault_id]) for v in"
        " vaults])\n",
        1,
    ),
    # the digest carried in the push answer (relay.store.carried_digest)
    ("    return carried_in(results, jobs, decision.vaults)\n", "    return results\n", 1),
]
# The before database: without the vault columns of revisions 0008 and 0012.
_BEFORE_SCHEMA: Final = (
    "ALTER TABLE vaults DROP COLUMN digest, DROP COLUMN bucket_prefixes, DROP COLUMN bucket_counts",
)


def before_source() -> str:
    """relay.store.push's source without the digest (see `_WITHOUT_DIGEST`)."""
    from engram_sync.relay.store import push

    source = inspect.getsource(push)
    # and the fold itself and the carried digest's helpers, which nothing calls any more
    without = [
        *_WITHOUT_DIGEST,
        *(
            (inspect.getsource(f), "", 1)
            for f in (
                push._bucket_and_hash,
                push._fold_digests,
                push.carried_in,  # the digest carried in the answer (ours, issue 36)
                push._with_carried,
            )
        ),
    ]
    for old, new, times in without:
        found = source.count(old)
        if found != times:
            raise RuntimeError(f"relay.store.push changed: {old!r} found {found}, not {times}")
        source = source.replace(old, new)
    for gone in (
        "digest_bucket",
        "version_hash(",
        "bucket_of(",
        "_fold_",
        "_hashes(",
        "_bucket_and_hash(",
    ):
        code = [line.split("#")[0] for line in source.splitlines() if "import" not in line]
        lines = [line for line in code if gone in line]
        if any(not line.lstrip().startswith(('"', "`")) for line in lines):
            raise RuntimeError(f"relay.store.push still has {gone!r} at work: {lines}")
    return source


def install_before() -> None:
    """Put the `before` push in place of relay.store.push, before the relay imports it."""
    spec = importlib.util.find_spec(PUSH_MODULE)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"{PUSH_MODULE} not found")
    source = before_source()  # imports the real module once, to read its source
    module = importlib.util.module_from_spec(spec)
    sys.modules[PUSH_MODULE] = module  # dataclasses look their module up
    exec(compile(source, f"<before-digest {spec.origin}>", "exec"), module.__dict__)  # noqa: S102 - our own source
    package = sys.modules[PUSH_MODULE.rsplit(".", 1)[0]]
    package.push = module  # type: ignore[attr-defined]


async def _before_schema(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for statement in _BEFORE_SCHEMA:
            await conn.execute(statement)
    finally:
        await conn.close()


def _bodies(corpus: Corpus, vault_id: str, blobs: int, bump: int) -> list[tuple[int, bytes]]:
    """Push bodies of blobs 0..blobs-1 of `vault_id`, their clocks raised by `bump`."""
    return [
        (len(batch), encode_json(PushRequest(blobs=batch)))
        for batch in (
            [msgspec.structs.replace(b, vector_clock=b.vector_clock + bump) for b in batch]
            for batch in corpus.batches(
                vault_id=vault_id, device_id=DEVICE, start=0, count=blobs, batch=BATCH
            )
        )
    ]


def _expected(corpus: Corpus, vault_id: str, blobs: int) -> str:
    """The digest of a vault after a round: every memory at its raised clock."""
    versions: Iterator[Version] = (
        Version(b.memory_id, b.device_id, b.vector_clock + 1, b.deleted)
        for batch in corpus.batches(
            vault_id=vault_id, device_id=DEVICE, start=0, count=blobs, batch=BATCH
        )
        for b in batch
    )
    return digest_text(fold(versions)[0])


def _interleaved(
    clients: dict[str, httpx.Client],
    bodies: dict[str, list[tuple[int, bytes]]],
    vaults: dict[str, str],
    first: int,
) -> dict[str, list[float]]:
    """Each batch to both relays, one after the other, the order alternating per batch (the
    checkpoints, autovacuum and the neighbours' load of the machine then fall on both
    alike); the seconds of each batch, per relay."""
    names = sorted(clients)
    took: dict[str, list[float]] = {name: [] for name in names}
    for j in range(len(bodies[names[0]])):
        for name in names[(j + first) % 2 :] + names[: (j + first) % 2]:
            took[name].append(push_all(clients[name], vaults[name], bodies[name][j : j + 1]))
    return took


def _round(
    clients: dict[str, httpx.Client], corpus: Corpus, tag: str, blobs: int, first: int
) -> tuple[dict[str, str], dict[str, dict[str, float]], dict[str, list[float]]]:
    """A new vault on each relay: its blobs pushed, then replaced; (the vaults, the
    seconds of each, the seconds of each one's batches in the order sent)."""
    vaults = {name: f"digest-push-{name}-{tag}" for name in clients}
    new = _interleaved(
        clients, {n: _bodies(corpus, v, blobs, 0) for n, v in vaults.items()}, vaults, first
    )
    again = _interleaved(
        clients, {n: _bodies(corpus, v, blobs, 1) for n, v in vaults.items()}, vaults, first + 1
    )
    seconds = {name: {"new_s": sum(new[name]), "replace_s": sum(again[name])} for name in vaults}
    for part in seconds.values():
        part["s"] = part["new_s"] + part["replace_s"]
    return vaults, seconds, {name: new[name] + again[name] for name in vaults}


def paired(with_s: list[float], before_s: list[float]) -> dict[str, float]:
    """Each batch's with / before - 1 (the two pushed back to back): median, quartiles.
    A checkpoint, autovacuum or a neighbour's burst lands on single batches, and moves a
    round's sum by several points (the rounds' spread); the median of the pairs is what a
    push costs more, the quartiles how far single pairs scatter."""
    ratios = sorted(w / b - 1 for w, b in zip(with_s, before_s, strict=True))
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return {"median": median, "q1": q1, "q3": q3, "pairs": len(ratios)}


def _stored_digest(client: httpx.Client, vault_id: str) -> str:
    answer = client.get(f"/v1/vaults/{vault_id}/digest")
    answer.raise_for_status()
    digest: str = answer.json()["digest"]
    return digest


def measure_relays(
    clients: dict[str, httpx.Client],
    corpus: Corpus,
    *,
    blobs: int,
    rounds: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The rounds against the `with` and `before` relays' clients."""
    times: dict[str, list[dict[str, float]]] = {"with": [], "before": []}
    batches: dict[str, list[float]] = {"with": [], "before": []}
    vaults: dict[str, list[str]] = {"with": [], "before": []}
    for r in range(rounds + 1):  # round 0 warms both up, unmeasured
        size = blobs if r else min(blobs, 4 * BATCH)
        pushed, took, each = _round(clients, corpus, f"{r}-{secrets.token_hex(3)}", size, r)
        if r:
            for name in times:
                vaults[name].append(pushed[name])
                times[name].append(took[name])
                batches[name] += each[name]
            ratio = times["with"][-1]["s"] / times["before"][-1]["s"] - 1
            log(f"digest push: round {r}/{rounds}, with / before - 1 = {ratio:+.1%}")
    with_digest = [_stored_digest(clients["with"], v) for v in vaults["with"]]
    kept = all(
        got == _expected(corpus, v, blobs)
        for got, v in zip(with_digest, vaults["with"], strict=True)
    )
    # The before relay keeps none: its digest route reads a column that is not there.
    before_keeps_none = all(
        clients["before"].get(f"/v1/vaults/{v}/digest").status_code >= 400 for v in vaults["before"]
    )

    def ratios(part: str) -> list[float]:
        return [w[part] / b[part] - 1 for w, b in zip(times["with"], times["before"], strict=True)]

    return {
        "blobs": blobs,
        "batch": BATCH,
        "rounds": rounds,
        "with_s": summary([t["s"] for t in times["with"]], "s"),
        "before_s": summary([t["s"] for t in times["before"]], "s"),
        "with_blobs_per_s": 2 * blobs / statistics.median(t["s"] for t in times["with"]),
        "before_blobs_per_s": 2 * blobs / statistics.median(t["s"] for t in times["before"]),
        "new_overhead": summary(ratios("new_s"), "x"),
        "replace_overhead": summary(ratios("replace_s"), "x"),
        "overhead": summary(ratios("s"), "x"),
        "batch_overhead": paired(batches["with"], batches["before"]),
        "digest_kept": kept,
        "before_keeps_none": before_keeps_none,
    }


def measure(
    db: BenchDatabase,
    corpus: Corpus,
    *,
    blobs: int,
    rounds: int,
    log: Callable[[str], None],
    same: bool = False,
) -> dict[str, Any]:
    """Both relays on new databases of `db`'s server; the rounds; both stopped after.
    `same` (`--a-a`): the `before` relay is the relay as it is too, on a database like
    the `with` one, so the figures show what the method reads for no difference."""
    from bench.relay_process import RelayProcess

    key = "bench-" + secrets.token_urlsafe(24)
    with_url = db.another()
    before_url = db.another()
    if not same:
        asyncio.run(_before_schema(before_url))
    children = {
        "with": ("-m", "bench.relay_child"),
        "before": ("-m", "bench.relay_child")
        if same
        else ("-m", "bench.digest_push", "--serve-before"),
    }
    urls = {"with": with_url, "before": before_url}
    with ExitStack() as stack:
        clients = {}
        for name, child in children.items():
            log_path = Path(db.scratch) / f"relay-digest-{name}.log"
            relay = stack.enter_context(RelayProcess(urls[name], key, log_path, child=child))
            clients[name] = stack.enter_context(
                httpx.Client(base_url=relay.url, headers=headers(key, DEVICE), timeout=120.0)
            )
        log(f"digest push: {rounds} rounds of {blobs:,} new blobs and their replacements, "
            "with the digest and before it")  # fmt: skip
        started = time.perf_counter()
        result = measure_relays(clients, corpus, blobs=blobs, rounds=rounds, log=log)
    result["seconds"] = time.perf_counter() - started
    return result


def verdict(d: dict[str, Any]) -> str:
    """The PASS/FAIL line (bench.targets judges the same in the full report)."""
    median = d["overhead"]["median"]
    ok = median <= OVERHEAD and d["digest_kept"] and d["before_keeps_none"]
    return (
        f"{'PASS' if ok else 'FAIL'}: push with the digest / before it - 1 = {median:+.1%} "
        f"(<= {OVERHEAD:.0%}; rounds {', '.join(f'{v:+.1%}' for v in d['overhead']['values'])};"
        f" new {d['new_overhead']['median']:+.1%}, replacements "
        f"{d['replace_overhead']['median']:+.1%}; {d['with_blobs_per_s']:,.0f} against "
        f"{d['before_blobs_per_s']:,.0f} blobs/s; digest kept: {d['digest_kept']}; "
        f"batch pairs: median {d['batch_overhead']['median']:+.1%}, quartiles "
        f"{d['batch_overhead']['q1']:+.1%}..{d['batch_overhead']['q3']:+.1%})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.digest_push")
    parser.add_argument("--blobs", type=int, default=50_000, help="blobs a round and relay")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--serve-before", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--a-a", action="store_true", help="the relay against itself: the method's own spread"
    )
    args = parser.parse_args(argv)
    if args.serve_before:  # the child of the `before` relay
        install_before()
        from bench.relay_child import serve

        serve()
        return 0
    from bench.database import BenchDatabase

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    corpus = Corpus.make(args.blobs)
    with BenchDatabase() as db:
        result = measure(db, corpus, blobs=args.blobs, rounds=args.rounds, log=log, same=args.a_a)
    print(json.dumps(result, indent=2))
    print(verdict(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
