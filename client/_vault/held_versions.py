"""The versions this device holds, as the anti-entropy digest sees them (PROTOCOL §18).

"The versions the device holds" (docs/digest.md): for every memory in
`sync_known_clocks` (the highest version this device applied or pushed, PROTOCOL §8),
that version `(memory_id, device_id, vector_clock)`, with `deleted` = the vault holds
no row of the memory and no pending local deletion of it (a row, or a deletion not yet
pushed, means the known version is the live one the relay should hold). A memory kept
local (docs/privacy.md) counts as the relay was last given it: live at its known clock
(also when deleted here only: `sync_local_deletions`), or deleted when the relay's version
at that clock is a deletion (`sync_retractions`). Left out:
memories with no known version (never pushed or pulled: ordinary pending pushes) and
tombstones the relay showed as compacted at that very clock (`sync_digest_compacted`).

Repairs only ever add: `requeue` marks versions the relay lacks for the next push, and
`mark_compacted` leaves a tombstone out of the digest; neither deletes a memory.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from engram_sync.shared_format.digest import Version, bucket_of, fold
from engram_sync.shared_format.timestamps import utc_now_rfc3339

_HELD = (
    "SELECT k.memory_id, k.device_id, k.vector_clock,"
    " ((e.id IS NULL AND t.id IS NULL AND d.memory_id IS NULL)"
    "  OR coalesce(r.vector_clock = k.vector_clock, 0)) AS deleted,"
    " c.vector_clock AS compacted"
    " FROM sync_known_clocks k"
    " LEFT JOIN engrams e ON e.id = k.memory_id"
    " LEFT JOIN tombstones t ON t.id = k.memory_id"
    " LEFT JOIN sync_local_deletions d ON d.memory_id = k.memory_id"
    " LEFT JOIN sync_retractions r ON r.memory_id = k.memory_id"
    " LEFT JOIN sync_digest_compacted c ON c.memory_id = k.memory_id"
)


def held_versions(conn: sqlite3.Connection) -> list[Version]:
    """Every version this device holds (see the module docstring)."""
    held: list[Version] = []
    for memory_id, device_id, clock, deleted, compacted in conn.execute(_HELD):
        if deleted and compacted == clock:
            continue
        held.append(Version(memory_id, device_id, int(clock), bool(deleted)))
    return held


def by_bucket(versions: Iterable[Version]) -> dict[int, list[Version]]:
    """The versions grouped by bucket (first byte of SHA-256(memory_id))."""
    buckets: dict[int, list[Version]] = {}
    for v in versions:
        buckets.setdefault(bucket_of(v.memory_id), []).append(v)
    return buckets


def bucket_digests(versions: Iterable[Version]) -> dict[int, tuple[int, int]]:
    """bucket -> (digest, count) of the non-empty buckets."""
    return {b: fold(vs) for b, vs in by_bucket(versions).items()}


def requeue(conn: sqlite3.Connection, held: list[Version]) -> int:
    """Queue again, for the next push, held versions the relay lacks: a live row is marked
    unpushed (its next push takes a new clock, above the relay's), a deletion gets its
    tombstone back in `tombstones`. Returns how many were queued (nothing is removed)."""
    queued = 0
    for v in held:
        if v.deleted:
            queued += conn.execute(
                "INSERT OR IGNORE INTO tombstones (id, deleted_at) SELECT ?, ?"
                " WHERE NOT EXISTS (SELECT 1 FROM engrams WHERE id = ?)",
                (v.memory_id, utc_now_rfc3339(), v.memory_id),
            ).rowcount
        else:
            queued += conn.execute(
                "UPDATE engrams SET synced_at = NULL WHERE id = ? AND synced_at IS NOT NULL"
                " AND privacy_level <> 'strict_local'",  # never pushed (docs/privacy.md)
                (v.memory_id,),
            ).rowcount
    return queued


def mark_compacted(conn: sqlite3.Connection, versions: list[Version]) -> None:
    """Leave these held tombstones out of the digest from now on (the relay compacted
    them, PROTOCOL §12): only while the memory's known clock stays the one given."""
    conn.executemany(
        "INSERT OR REPLACE INTO sync_digest_compacted (memory_id, vector_clock) VALUES (?, ?)",
        [(v.memory_id, v.vector_clock) for v in versions if v.deleted],
    )
