"""`strict_local` on the sync paths (PROTOCOL §8 "strict_local never leaves the device";
docs/privacy.md): a pulled version meeting a memory this device keeps local, and pushing
the retractions `engram-sync retract` queued.

A pulled (or fetched) version that wins LWW for a memory kept local is not applied: the
local memory stays as it is, its level included; the remote version is kept in
`sync_conflicts` (where `engram-sync conflicts` shows it and `conflicts restore` brings it
back as a local edit) and its clock recorded as known, so it is not applied again at every
sync. A remote deletion is recorded as the relay's version (`sync_retractions`), so the
digest (PROTOCOL §18) agrees with the relay.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from engram_sync.shared_format.plaintext import (
    MemoryPlaintext,
    Tombstone,
    encode_memory,
    tombstone_plaintext,
)

from .._vault.privacy import (
    keeps_local,
    mark_retracted,
    pending_retractions,
)
from .._vault.store import (
    KnownVersion,
    known_version,
    record_conflict,
    remember_version,
)

if TYPE_CHECKING:
    from .reports import SyncReport
    from .syncer_parts import SyncerParts


def kept_out(
    conn: sqlite3.Connection,
    memory_id: str,
    decoded: MemoryPlaintext | Tombstone,
    deleted: bool,
    remote: KnownVersion,
    own_device: str,
    report: SyncReport,
) -> bool:
    """A winning remote version of a memory this device keeps local: kept aside, not
    applied (see the module doc). False (nothing done) for any other memory."""
    if not keeps_local(conn, memory_id):
        return False
    gone = deleted or isinstance(decoded, Tombstone)
    if gone:
        mark_retracted(conn, memory_id, remote.vector_clock)
    elif remote.device_id != own_device:  # our own push coming back is no conflict
        assert isinstance(decoded, MemoryPlaintext)
        row = record_conflict(
            conn, memory_id, encode_memory(decoded), decoded.modified_at, remote, False
        )
        conn.execute("INSERT INTO sync_kept_out (conflict_id) VALUES (?)", (row,))
        report.conflicts += 1
    remember_version(conn, memory_id, remote)
    report.stale += 1
    return True


def push_retractions(syncer: SyncerParts, report: SyncReport) -> None:
    """Push a tombstone for each retraction queued (`engram-sync retract`); the local
    memory stays. One accepted is recorded at the clock it was pushed with."""
    conn = syncer.vault.conn
    ids = pending_retractions(conn)
    for start in range(0, len(ids), syncer.push_batch):
        batch = ids[start : start + syncer.push_batch]
        before = {m: known_version(conn, m) for m in batch}
        items: list[tuple[str, str, str | None]] = [
            (m, tombstone_plaintext(m), None) for m in batch
        ]
        syncer._push_batch(items, deleted=True, report=report)
        with syncer.vault.transaction() as tx:
            for memory_id in batch:
                now = known_version(tx, memory_id)
                moved = now is not None and now != before[memory_id]
                if moved and now is not None and now.device_id == syncer.device.device_id:
                    mark_retracted(tx, memory_id, now.vector_clock)
