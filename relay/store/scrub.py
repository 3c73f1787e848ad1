"""The scrub: the stored digest made true again from the rows (PROTOCOL §18, issue 35).

The vault digest, its counts, its 256 bucket prefixes and counts, and the quota's
`bytes_used` are running totals kept by pushes and compaction (relay.store.push,
relay.store.compaction). A blob row that goes away any other way (a disk fault, a partial
restore, a hand edit) leaves them claiming a version the relay no longer holds: every
device holding it is "in agreement" and no repair restores it. The scrub recomputes them
from the vault's rows and, where they differ, counts it, says so and writes the true
values; the devices' next check then sees the mismatch and pushes the missing versions
again (docs/digest.md "The scrub").

One vault at a time, in one transaction that takes the vault row lock a push takes
(`FOR UPDATE`), so no push commits between the pass over the rows and the write of the
totals (in READ COMMITTED the pass, a statement after the lock, sees every push that
committed before it, and every later push waits for the scrub). It blocks that vault's
pushes for the length of the pass (0.3-0.7 s for 1,000,000 memories) and runs under
`SET LOCAL statement_timeout`: past it the transaction is rolled back, nothing changed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import asyncpg

from engram_sync.relay.store.digest import XOR_WORDS, bucket_of_sql, xor_of_words
from engram_sync.shared_format.digest import BUCKETS, bucket_prefixes, digest_bytes, digest_int

_COUNTS: Final = struct.Struct(f">{BUCKETS}I")

# One pass over the vault's rows (its key range), grouped by bucket.
_ROW_TOTALS = f"""
SELECT digest_bucket, count(*) AS n, count(*) FILTER (WHERE deleted) AS dead,
       sum(size_bytes) AS size, {XOR_WORDS}
FROM (SELECT {bucket_of_sql("b.memory_id")} AS digest_bucket, b.deleted, b.size_bytes,
             engram_version_hash(b.memory_id, b.device_id, b.vector_clock, b.deleted) AS v
      FROM blobs b WHERE b.vault_id = $1) x
GROUP BY digest_bucket
"""  # noqa: S608 - constants only
_LOCK_VAULT = (
    "SELECT digest, live_blobs, tombstones, bucket_prefixes, bucket_counts, bytes_used"
    " FROM vaults WHERE vault_id = $1 FOR UPDATE"
)
_REPAIR = (
    "UPDATE vaults SET digest = $2, live_blobs = $3, tombstones = $4, bucket_prefixes = $5,"
    " bucket_counts = $6, bytes_used = $7, scrubbed_at = now(),"
    " scrub_mismatches = scrub_mismatches + 1"
    " WHERE vault_id = $1"
)
_CLEAN = "UPDATE vaults SET scrubbed_at = now() WHERE vault_id = $1"
# Least recently scrubbed first (never scrubbed before all), then by id.
_DUE = """
SELECT vault_id FROM vaults
WHERE scrubbed_at IS NULL OR scrubbed_at <= now() - make_interval(secs => $1)
ORDER BY scrubbed_at NULLS FIRST, vault_id LIMIT $2
"""


@dataclass(frozen=True)
class Totals:
    """What the vault row holds of its rows: digest, live and tombstone counts, the 256
    bucket prefixes (8 bytes each) and counts (big-endian u32 each), and the bytes the
    quota counts (PROTOCOL §6: the sum of the rows' `size_bytes`)."""

    digest: int
    live: int
    tombstones: int
    prefixes: bytes
    counts: bytes
    size: int

    @classmethod
    def of_buckets(cls, rows: list[asyncpg.Record]) -> Totals:
        """The totals of `_ROW_TOTALS`'s rows (one per non-empty bucket)."""
        digests = {int(r["digest_bucket"]): xor_of_words(r) for r in rows}
        counts = [0] * BUCKETS
        for r in rows:
            counts[int(r["digest_bucket"])] = int(r["n"])
        digest = 0
        for value in digests.values():
            digest ^= value
        dead = sum(int(r["dead"]) for r in rows)
        size = sum(int(r["size"]) for r in rows)
        return cls(
            digest, sum(counts) - dead, dead, bucket_prefixes(digests), _COUNTS.pack(*counts),
            size,
        )  # fmt: skip

    @classmethod
    def of_vault(cls, row: asyncpg.Record) -> Totals:
        """The totals the vault row stores."""
        return cls(
            digest_int(row["digest"]),
            int(row["live_blobs"]),
            int(row["tombstones"]),
            bytes(row["bucket_prefixes"]),
            bytes(row["bucket_counts"]),
            int(row["bytes_used"]),
        )


def differences(stored: Totals, rows: Totals) -> list[str]:
    """Which of the stored totals the rows contradict (empty: the vault row is true)."""
    named = ("digest", "live", "tombstones", "prefixes", "counts", "size")
    return [name for name in named if getattr(stored, name) != getattr(rows, name)]


@dataclass(frozen=True)
class ScrubResult:
    """One vault's scrub: `clean`, `repaired`, `timed_out` or `gone` (no such vault)."""

    vault_id: str
    outcome: str
    differed: tuple[str, ...] = ()
    stored_count: int = 0  # versions the vault row claimed
    row_count: int = 0  # versions its rows hold


async def scrub_vault(conn: asyncpg.Connection, vault_id: str, timeout_ms: int) -> ScrubResult:
    """Recompute `vault_id`'s totals from its rows under its row lock and make the stored
    ones true; `timed_out` (nothing changed, `scrubbed_at` moved so the vault goes behind
    the others) when the pass took longer than `timeout_ms`."""
    try:
        async with conn.transaction():
            # an int, formatted: SET takes no bind parameters
            await conn.execute(f"SET LOCAL statement_timeout = {max(1, int(timeout_ms))}")
            row = await conn.fetchrow(_LOCK_VAULT, vault_id)  # as a push does
            if row is None:
                return ScrubResult(vault_id, "gone")
            stored = Totals.of_vault(row)
            true = Totals.of_buckets(await conn.fetch(_ROW_TOTALS, vault_id))
            differed = differences(stored, true)
            counts = (stored.live + stored.tombstones, true.live + true.tombstones)
            if not differed:
                await conn.execute(_CLEAN, vault_id)
                return ScrubResult(vault_id, "clean", (), *counts)
            await conn.execute(
                _REPAIR, vault_id, digest_bytes(true.digest), true.live, true.tombstones,
                true.prefixes, true.counts, true.size,
            )  # fmt: skip
            return ScrubResult(vault_id, "repaired", tuple(differed), *counts)
    except asyncpg.QueryCanceledError:
        await conn.execute(_CLEAN, vault_id)
        return ScrubResult(vault_id, "timed_out")


async def due_vaults(conn: asyncpg.Connection, interval_s: float, limit: int) -> list[str]:
    """At most `limit` vaults not scrubbed within `interval_s`, least recently first."""
    rows = await conn.fetch(_DUE, float(interval_s), limit)
    return [r["vault_id"] for r in rows]


async def scrub_due(
    conn: asyncpg.Connection, interval_s: float, limit: int, timeout_ms: int
) -> list[ScrubResult]:
    """Scrub, one after another, the vaults `due_vaults` names."""
    return [
        await scrub_vault(conn, vault_id, timeout_ms)
        for vault_id in await due_vaults(conn, interval_s, limit)
    ]
