"""Figure 12, anti-entropy (PROTOCOL §18, docs/digest.md, issue 16).

1. Finding one divergent memory in a vault of 1,000,000 memories (20,000 with
   `--quick`): the vault's relay rows are written straight in SQL (as figure 4 fills its
   large vault), and a device holding every version of it but one asks the relay over
   HTTP with the client's own narrowing (`client._sync.anti_entropy.AntiEntropy.locate`:
   the vault digest, `?buckets=1`, then `POST .../digest/narrow` for the bucket that
   differs). Counted: round trips, and bytes on the wire in both directions (request
   line, headers and body out; status line, headers and body in; HTTP/1.1 over loopback,
   no TLS), next to the JSON bodies alone.
2. What keeping the digest costs a push: push throughput over HTTP with the digest kept
   against the push as it was before it, two relay processes on two new databases
   (`bench.digest_push`: new memories and their replacements, batches of 500, rounds
   alternating), and, beside it, the push path's hashing per blob in CPU time (the
   bucket, two SHA-256 version hashes and the bucket prefix's XOR, which the relay now
   does while the database writes the blobs: `relay.store.overlap`).
3. `?buckets=1`: the stored prefixes and counts (revision 0012, one row read) against
   the grouped pass over the vault's rows it was before (`relay.store.digest._BUCKETS`,
   timed once: 139 s for 1,000,000 rows).

Alone: `python -m bench.anti_entropy [--quick] [--vault N] [--blobs N] [--repeats N]
[--rounds N]` (its own embedded PostgreSQL and relay processes; prints the JSON and
PASS/FAIL lines; `--quick`: 20,000 memories, 2,000 blobs a push round).
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

from bench import ceiling, digest_push, scan_fairness
from bench.corpus import Corpus
from bench.stats import summary
from engram_sync.client._http.relay_client import RelayClient
from engram_sync.client._sync.anti_entropy import AntiEntropy
from engram_sync.client._sync.reports import SyncReport
from engram_sync.relay.store import digest as digest_store
from engram_sync.relay.store.bucket_prefixes import PREFIX_SHIFT
from engram_sync.shared_format.digest import Version, bucket_of, version_hash

if TYPE_CHECKING:
    from bench.database import BenchDatabase
    from bench.runner import Run
    from engram_sync.client._sync.engine import Syncer

FIND_VAULT_FULL = 1_000_000
FIND_VAULT_QUICK = 20_000
FIND_ROUND_TRIPS = 3  # issue 16 (bench.targets has the same)
FIND_BYTES = 16 * 1024
PUSH_BLOBS = 50_000  # a push round of bench.digest_push, at most
ROUNDS = 6
QUICK_ROUNDS = 2

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
).backfill("vault_id = $1", digest_store.bucket_of_sql("memory_id"))
# One chunk of the 1,000,000-memory vault, straight in SQL: memory i is `ae-<i>`, clock i.
_FILL = """
INSERT INTO blobs (vault_id, memory_id, device_id, vector_clock, ciphertext, hmac, created_at,
                   created_at_ts, deleted, seq, size_bytes)
SELECT $1, 'ae-' || lpad(i::text, 7, '0'), 'bench-device', i, 'c', 'h',
       '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', false, i, 1
FROM generate_series($2::bigint, $3::bigint) AS i
ON CONFLICT DO NOTHING
"""
_FILL_CHUNK = 100_000


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


async def bucket_reads(conn: asyncpg.Connection, vault_id: str) -> dict[str, Any]:
    """The relay's bucket statements on the vault's busiest bucket: whether their plans
    scan all of blobs rather than the vault's rows (EXPLAIN), and how long each takes
    (median of 3, ms): a narrowing, a list page from the middle of the bucket, one
    bucket's digest, and every bucket's (`?buckets=1`): stored (revision 0012) and, once,
    the grouped pass over the vault's rows it was before. Since revision 0014 a bucket
    is no index range: each of the first three passes over the vault's rows."""
    bucket_sql = digest_store.bucket_of_sql("memory_id")
    rows = f"SELECT memory_id FROM blobs WHERE vault_id = $1 AND {bucket_sql} = $2"  # noqa: S608
    bucket = await conn.fetchval(
        f"SELECT {bucket_sql} FROM blobs WHERE vault_id = $1 GROUP BY 1"  # noqa: S608
        " ORDER BY count(*) DESC LIMIT 1",
        vault_id,
    )
    middle = await conn.fetchval(
        f"{rows} ORDER BY memory_id OFFSET (SELECT count(*) / 2 FROM ({rows}) b) LIMIT 1",  # noqa: S608
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
            "uses_vault_key": "blobs_pkey" in plan,
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
    db: BenchDatabase,
    corpus: Corpus,
    *,
    vault_blobs: int,
    push_blobs: int,
    repeats: int,
    rounds: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Figure 12 on a database and relay (url, key) already running; the push rounds on
    two more databases of the same server (`bench.digest_push`), first: after the vault's
    million rows, the server's checkpoint and autovacuum of them fell on the rounds (one
    run +6.9% where the push figure alone gave -1.2% and +2.4% in the same hour)."""
    push = digest_push.measure(db, corpus, blobs=push_blobs, rounds=rounds, log=log)
    vault_id = loop.run(_find_vault(conn, vault_blobs, log))
    reads = loop.run(bucket_reads(conn, vault_id))
    held = vault_versions(vault_blobs)
    log(f"anti-entropy: one divergent memory in a vault of {len(held):,} memories")
    finds = [find_one(relay[0], relay[1], vault_id, held) for _ in range(repeats)]
    del held
    hashed = min(push_blobs, 20_000)
    return {
        "vault_blobs": vault_blobs,
        "round_trips": summary([float(f["round_trips"]) for f in finds], "round trips"),
        "wire_bytes": summary([float(f["wire_bytes"]) for f in finds], "bytes"),
        "json_bytes": summary([float(f["json_bytes"]) for f in finds], "bytes"),
        "answer_bytes": summary([float(f["answer_bytes"]) for f in finds], "bytes"),
        "found": all(f["found"] for f in finds),
        "find_s": summary([f["seconds"] for f in finds], "s"),
        "bucket_reads": reads,
        "push": push,
        "python_us_per_blob": python_seconds_per_blob(corpus, hashed) * 1e6,
        "python_us_per_blob_without_prefixes": (  # before revision 0012
            python_seconds_per_blob(corpus, hashed, prefixes=False) * 1e6
        ),
        # PROTOCOL §18, issue 16: push throughput with the digest against before it
        "push_overhead": push["overhead"]["median"],
        "push_digest_kept": push["digest_kept"] and push["before_keeps_none"],
    }


def measure(run: Run) -> dict[str, Any]:
    """Figure 12 inside `python -m bench`: the find on a vault of 1,000,000 memories
    (20,000 quick); the push rounds of the run's size (at most 50,000 blobs: 6 rounds; 2
    quick)."""
    with run.monitor.phase("digest_cost"):
        parts = measure_parts(
            run.loop,
            run.conn,
            (run.relay.url, run.relay.key),
            run.db,
            run.corpus,
            vault_blobs=FIND_VAULT_QUICK if run.s.quick else FIND_VAULT_FULL,
            push_blobs=min(run.s.n, PUSH_BLOBS),
            repeats=run.s.repeats,
            rounds=QUICK_ROUNDS if run.s.quick else ROUNDS,
            log=run.log,
        )
    parts["scan_fairness"] = scan_fairness.measure(run)  # issue 31: the repair path, flooded
    return parts


def verdicts(d: dict[str, Any]) -> list[str]:
    """PASS/FAIL lines of figure 12 (bench.targets judges the same in the full report)."""
    trips, wire = d["round_trips"]["median"], d["wire_bytes"]["median"]
    return [
        f"{'PASS' if trips <= FIND_ROUND_TRIPS and d['found'] else 'FAIL'}: one divergent memory "
        f"in {d['vault_blobs']:,} memories {'found' if d['found'] else 'NOT found'} in "
        f"{trips:g} round trips (<= {FIND_ROUND_TRIPS})",
        f"{'PASS' if wire <= FIND_BYTES else 'FAIL'}: {wire:,.0f} bytes on the wire both ways "
        f"(<= {FIND_BYTES:,}; JSON bodies alone {d['json_bytes']['median']:,.0f})",
        digest_push.verdict(d["push"]),
        *([scan_fairness.verdict(d["scan_fairness"])] if "scan_fairness" in d else []),
    ]


def main(argv: list[str] | None = None) -> int:
    """Figure 12 alone, on its own embedded PostgreSQL and relay process."""
    from bench.database import BenchDatabase
    from bench.relay_process import RelayProcess

    parser = argparse.ArgumentParser(prog="python -m bench.anti_entropy")
    parser.add_argument("--vault", type=int, default=FIND_VAULT_FULL, help="memories to search")
    parser.add_argument("--blobs", type=int, default=PUSH_BLOBS, help="blobs a push round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="push rounds")
    parser.add_argument(
        "--quick", action="store_true", help=f"{FIND_VAULT_QUICK:,} memories, 2,000 blobs"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.vault, args.blobs, args.rounds = FIND_VAULT_QUICK, 2_000, QUICK_ROUNDS

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
                    loop, conn, (relay.url, key), db, corpus, vault_blobs=args.vault,
                    push_blobs=args.blobs, repeats=args.repeats, rounds=args.rounds, log=log,
                )  # fmt: skip
            finally:
                loop.run(conn.close())
    print(json.dumps(result, indent=2))
    for line in verdicts(result):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
