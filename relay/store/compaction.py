"""Tombstone retention and compaction (PROTOCOL §12).

A tombstone is removed only when it is older than the retention period AND every
non-revoked device seen in that period has pulled past it. The highest removed
sequence becomes the vault's compaction horizon: a device whose cursor is below
it gets 409 `resync_required` instead of silently missing deletions.

PROTOCOL §18: the vault digest covers the blob rows the relay holds, so a removed
tombstone is XORed out of it in the same transaction (docs/digest.md: a device learns
that a tombstone was compacted when a bucket list lacks it, and leaves it out of its own
digest from then on). The vault's stored bucket prefixes and counts (revision 0012) lose
the same versions, each from its bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from engram_sync.relay.store.bucket_prefixes import PREFIX_SHIFT, apply_changes
from engram_sync.relay.store.digest import XOR_WORDS, xor_of_words
from engram_sync.shared_format.digest import digest_bytes, digest_int


@dataclass(frozen=True)
class CompactionResult:
    """What one compaction of one vault removed."""

    vault_id: str
    removed: int
    horizon: int


async def compact_vault(
    conn: asyncpg.Connection, vault_id: str, retention: timedelta
) -> CompactionResult:
    """Compact one vault under its row lock (serialised with pushes to it)."""
    async with conn.transaction():
        vault = await conn.fetchrow(
            "SELECT seq, compacted_through, digest, bucket_prefixes, bucket_counts FROM vaults"
            " WHERE vault_id = $1 FOR UPDATE",
            vault_id,
        )
        if vault is None:
            return CompactionResult(vault_id, 0, 0)
        # Every non-revoked device seen within the retention period must have pulled past
        # a tombstone; with no such device, nobody is left to miss one.
        safe = await conn.fetchval(
            "SELECT coalesce(min(pulled_cursor), $2) FROM devices WHERE vault_id = $1"
            " AND revoked_at IS NULL AND last_seen > now() - $3::interval",
            vault_id,
            vault["seq"],
            retention,
        )
        # One row per bucket of the removed versions (PROTOCOL §18). The function, not
        # `bucket_of_sql`: Citus allows only IMMUTABLE functions in RETURNING, and
        # convert_to() is STABLE.
        rows = await conn.fetch(
            f"""
            WITH removed AS (
                DELETE FROM blobs WHERE vault_id = $1 AND deleted AND seq <= $2
                    AND received_at < now() - $3::interval
                RETURNING seq, size_bytes, engram_digest_bucket(memory_id) AS digest_bucket,
                    engram_version_hash(memory_id, device_id, vector_clock, deleted) AS v
            )
            SELECT digest_bucket, count(*) AS n, coalesce(max(seq), 0) AS top,
                   coalesce(sum(size_bytes), 0) AS bytes, {XOR_WORDS}
            FROM removed GROUP BY digest_bucket
            """,  # noqa: S608 - constants only
            vault_id,
            safe,
            retention,
        )
        count = sum(int(r["n"]) for r in rows)
        horizon = max([vault["compacted_through"], *(int(r["top"]) for r in rows)])
        if count:
            await _take_out(conn, vault_id, vault, rows, horizon)
        return CompactionResult(vault_id, count, horizon)


async def _take_out(
    conn: asyncpg.Connection,
    vault_id: str,
    vault: asyncpg.Record,
    rows: list[asyncpg.Record],
    horizon: int,
) -> None:
    """The vault row without the removed tombstones: horizon, bytes, count, and the digest
    and bucket prefixes with their versions XORed out (PROTOCOL §18, revision 0012)."""
    removed = 0
    xors: dict[int, int] = {}
    gone: dict[int, int] = {}
    for r in rows:
        hashes = xor_of_words(r)  # the XOR of the removed versions' hashes
        removed ^= hashes
        xors[r["digest_bucket"]] = hashes >> PREFIX_SHIFT  # PROTOCOL §18, 0012
        gone[r["digest_bucket"]] = -int(r["n"])
    prefixes, counts = apply_changes(vault["bucket_prefixes"], vault["bucket_counts"], xors, gone)
    await conn.execute(
        "UPDATE vaults SET compacted_through = $2, bytes_used = bytes_used - $3,"
        " tombstones = tombstones - $4, digest = $5, bucket_prefixes = $6,"
        " bucket_counts = $7 WHERE vault_id = $1",
        vault_id,
        horizon,
        sum(int(r["bytes"]) for r in rows),
        sum(int(r["n"]) for r in rows),
        digest_bytes(digest_int(vault["digest"]) ^ removed),  # PROTOCOL §18
        prefixes,
        counts,
    )


async def compact_vaults(conn: asyncpg.Connection, retention: timedelta) -> list[CompactionResult]:
    """Compact every vault that holds tombstones on `conn`; one short transaction per vault."""
    vaults = [
        r["vault_id"] for r in await conn.fetch("SELECT DISTINCT vault_id FROM blobs WHERE deleted")
    ]
    return [await compact_vault(conn, v, retention) for v in vaults]


async def compact_all(pool: asyncpg.Pool, retention: timedelta) -> list[CompactionResult]:
    """Compact every vault that holds tombstones; one short transaction per vault."""
    async with pool.acquire() as conn:
        return await compact_vaults(conn, retention)
