"""Figure 12, anti-entropy (PROTOCOL §18, docs/digest.md, issue 16).

1. Finding one divergent memory in a large vault: a device holding every version of the
   vault but one asks the relay over HTTP with the client's own narrowing
   (`client._sync.anti_entropy.AntiEntropy.locate`): round trips and answer bytes until
   it names the memory.
2. What keeping the digest costs a push: the relay's blob upsert into `blobs` (with the
   generated `digest_bucket` column and its index, revision 0008) against the same
   statement into a copy of the table without them, batches of 500, interleaved; plus
   the push path's Python work (two SHA-256 version hashes per blob) against the relay
   push time per blob measured in figure 2.
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import asyncpg

from bench import ceiling
from bench.corpus import Corpus
from bench.stats import summary
from engram_sync.client._sync.anti_entropy import AntiEntropy
from engram_sync.client._sync.engine import SyncReport
from engram_sync.client._sync.relay_client import RelayClient
from engram_sync.relay.store.push import BLOB_UPSERT
from engram_sync.shared_format.digest import Version, version_hash

if TYPE_CHECKING:
    from bench.runner import Run
    from engram_sync.client._sync.engine import Syncer

_WORDS = ", ".join(
    f"coalesce(bit_xor(('x' || encode(substr(v, {8 * n + 1}, 8), 'hex'))::bit(64)::bigint), 0)"
    f" AS w{n}"
    for n in range(4)
)
# Raw-SQL fills (bench.ceiling) bypass the push path: set the vault's digest and counts
# from its rows, as revision 0008's backfill does.
_RECOMPUTE = f"""
UPDATE vaults SET digest = int8send(x.w0) || int8send(x.w1) || int8send(x.w2) || int8send(x.w3),
    live_blobs = x.live, tombstones = x.dead
FROM (SELECT {_WORDS}, count(*) FILTER (WHERE NOT deleted) AS live,
             count(*) FILTER (WHERE deleted) AS dead
      FROM (SELECT deleted, engram_version_hash(memory_id, device_id, vector_clock, deleted) AS v
            FROM blobs WHERE vault_id = $1) h) x
WHERE vault_id = $1
"""  # noqa: S608 - constants only
_CLONE = "bench_blobs_without_digest"


class _Probe:
    """What AntiEntropy.locate needs of a Syncer: the relay, the vault id, and the sync
    state's blobs refused on pull (none here)."""

    def __init__(self, relay: RelayClient, vault_id: str) -> None:
        self.relay = relay
        self.vault_id = vault_id
        self.state = SimpleNamespace(skipped=[])


async def held_versions(conn: asyncpg.Connection, vault_id: str) -> list[Version]:
    """Every version the vault holds, after setting its digest from its rows."""
    await conn.execute(_RECOMPUTE, vault_id)
    rows = await conn.fetch(
        "SELECT memory_id, device_id, vector_clock, deleted FROM blobs WHERE vault_id = $1"
        " ORDER BY seq",
        vault_id,
    )
    return [Version(*r) for r in rows]


def find_one(url: str, key: str, vault_id: str, held: list[Version]) -> dict[str, Any]:
    """A device that lacks the last version of `held`: how it finds it."""
    missing = held[-1]
    device = held[:-1]
    with RelayClient(url, key) as relay:
        probe = AntiEntropy(cast("Syncer", _Probe(relay, vault_id)), SyncReport())
        started = time.perf_counter()
        plan = probe.locate(device)
        seconds = time.perf_counter() - started
    result = probe.result
    found = plan is not None and plan[0] == [missing.memory_id] and plan[1] == []
    return {
        "vault_blobs": len(held),
        "round_trips": result.round_trips,
        "answer_bytes": result.answer_bytes,
        "buckets_listed": len(result.buckets),
        "found": found,
        "seconds": seconds,
    }


async def _clone(conn: asyncpg.Connection) -> None:
    await conn.execute(f"DROP TABLE IF EXISTS {_CLONE}")
    await conn.execute(f"CREATE TABLE {_CLONE} (LIKE blobs INCLUDING DEFAULTS INCLUDING INDEXES)")
    await conn.execute(f"ALTER TABLE {_CLONE} DROP COLUMN digest_bucket")
    await conn.execute(  # LIKE copies no foreign key: the same check as blobs makes
        f"ALTER TABLE {_CLONE} ADD FOREIGN KEY (vault_id) REFERENCES vaults (vault_id)"
        " ON DELETE CASCADE"
    )


async def _write(conn: asyncpg.Connection, statement: str, prepared: ceiling.Prepared) -> float:
    await conn.execute(
        "INSERT INTO vaults (vault_id) VALUES ($1) ON CONFLICT DO NOTHING", prepared.vault_id
    )
    started = time.perf_counter()
    for cols in prepared.batches:
        await conn.execute(statement, *cols)
    return time.perf_counter() - started


def python_seconds_per_blob(corpus: Corpus, blobs: int) -> float:
    """The push path's digest work per blob: the old version out, the new one in."""
    ids = [corpus.memory_id(i) for i in range(blobs)]
    started = time.perf_counter()
    value = 0
    for i, memory_id in enumerate(ids):
        value ^= version_hash(memory_id, "bench-device", i, False)
        value ^= version_hash(memory_id, "bench-device", i + 1, False)
    return (time.perf_counter() - started) / blobs


async def write_overhead(
    conn: asyncpg.Connection, corpus: Corpus, *, blobs: int, repeats: int, batch: int
) -> dict[str, Any]:
    """Upsert seconds into `blobs` and into the copy without the digest column."""
    await _clone(conn)
    without = BLOB_UPSERT.replace("INSERT INTO blobs", f"INSERT INTO {_CLONE}", 1)
    assert without != BLOB_UPSERT
    with_s: list[float] = []
    without_s: list[float] = []
    try:
        for r in range(repeats + 1):  # repeat 0 warms both tables up, unmeasured
            order = [("with", BLOB_UPSERT, with_s), ("without", without, without_s)]
            for name, statement, into in order if r % 2 else order[::-1]:
                prepared = ceiling.prepare(
                    corpus, f"digest-cost-{name}-{r}", count=blobs, batch=batch
                )
                seconds = await _write(conn, statement, prepared)
                if r > 0:
                    into.append(seconds)
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {_CLONE}")
    return {"blobs": blobs, "batch": batch, "with_s": with_s, "without_s": without_s}


def measure(run: Run, push_blobs_per_s: float) -> dict[str, Any]:
    """Figure 12: one divergent memory in the large vault of figure 4, found over HTTP;
    and what keeping the digest costs a push."""
    vault = "size-large"
    held = run.loop.run(held_versions(run.conn, vault))
    run.log(f"anti-entropy: one divergent memory in a vault of {len(held)} blobs")
    finds = [find_one(run.relay.url, run.relay.key, vault, held) for _ in range(run.s.repeats)]
    blobs = min(run.s.n, 50_000)
    run.log(f"anti-entropy: upsert cost with and without the digest column, {blobs} blobs")
    with run.monitor.phase("digest_cost"):
        cost = run.loop.run(
            write_overhead(run.conn, run.corpus, blobs=blobs, repeats=run.s.repeats, batch=500)
        )
    python_s = python_seconds_per_blob(run.corpus, min(blobs, 20_000))
    database = [w / wo - 1 for w, wo in zip(cost["with_s"], cost["without_s"], strict=True)]
    python_share = python_s * push_blobs_per_s  # of the time one blob's push takes
    return {
        "vault_blobs": len(held),
        "round_trips": summary([float(f["round_trips"]) for f in finds], "round trips"),
        "answer_bytes": summary([float(f["answer_bytes"]) for f in finds], "bytes"),
        "found": all(f["found"] for f in finds),
        "find_s": summary([f["seconds"] for f in finds], "s"),
        "upsert_blobs": blobs,
        "upsert_with_s": summary(cost["with_s"], "s"),
        "upsert_without_s": summary(cost["without_s"], "s"),
        "database_overhead": summary(database, "x"),
        "python_us_per_blob": python_s * 1e6,
        "python_overhead": python_share,
        "push_overhead": statistics.median(database) + python_share,
    }
