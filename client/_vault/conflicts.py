"""Listing and restoring kept conflict copies (PROTOCOL §8: nothing is lost silently)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from engram_sync.shared_format.plaintext import MemoryPlaintext, Tombstone, decode_plaintext
from engram_sync.shared_format.timestamps import utc_now_rfc3339

from .history import CONFLICT, Writer, replacing
from .store import (
    apply_memory,
    delete_memory,
    get_row,
    mark_edited,
    named_rows,
    next_modified_at,
)


@dataclass(frozen=True)
class Conflict:
    """One kept local version that lost to a remote one, or (`kept_out`) a pulled version
    kept out of a memory this device keeps local (PROTOCOL §8 strict_local): then
    `local_*` hold that pulled version, and `remote_*` name it."""

    id: int
    memory_id: str
    local_content: str | None
    local_deleted: bool
    local_modified_at: str | None
    remote_device_id: str
    remote_vector_clock: int
    remote_deleted: bool
    detected_at: str
    kept_out: bool = False


def list_conflicts(conn: sqlite3.Connection) -> list[Conflict]:
    """Conflicts not yet restored, newest first."""
    rows = named_rows(
        conn,
        "SELECT id, memory_id, local_plaintext, local_modified_at, remote_device_id,"
        " remote_vector_clock, remote_deleted, detected_at, k.conflict_id IS NOT NULL AS kept_out"
        " FROM sync_conflicts LEFT JOIN sync_kept_out k ON k.conflict_id = id"
        " WHERE restored_at IS NULL ORDER BY id DESC",
    ).fetchall()
    result = []
    for r in rows:
        decoded = decode_plaintext(r["local_plaintext"])
        result.append(
            Conflict(
                id=r["id"],
                memory_id=r["memory_id"],
                local_content=decoded.content if isinstance(decoded, MemoryPlaintext) else None,
                local_deleted=isinstance(decoded, Tombstone),
                local_modified_at=r["local_modified_at"],
                remote_device_id=r["remote_device_id"],
                remote_vector_clock=r["remote_vector_clock"],
                remote_deleted=bool(r["remote_deleted"]),
                detected_at=r["detected_at"],
                kept_out=bool(r["kept_out"]),
            )
        )
    return result


def restore_conflict(
    conn: sqlite3.Connection, conflict_id: int, by: Writer, own_device: str
) -> str:
    """Bring a kept version back as an ordinary new local edit (the version it replaces is
    kept in the local history); returns the memory id."""
    row = named_rows(
        conn,
        "SELECT memory_id, local_plaintext FROM sync_conflicts"
        " WHERE id = ? AND restored_at IS NULL",
        (conflict_id,),
    ).fetchone()
    if row is None:
        raise ValueError(f"no open conflict #{conflict_id}; `engram-sync conflicts` lists them")
    memory_id: str = row["memory_id"]
    decoded = decode_plaintext(row["local_plaintext"], expected_id=memory_id)
    deletion = isinstance(decoded, Tombstone)
    with replacing(conn, memory_id, CONFLICT, by, own_device=own_device, deletion=deletion):
        _write_kept(conn, memory_id, decoded)
    conn.execute(
        "UPDATE sync_conflicts SET restored_at = ? WHERE id = ?", (utc_now_rfc3339(), conflict_id)
    )
    return memory_id


def _write_kept(
    conn: sqlite3.Connection, memory_id: str, decoded: MemoryPlaintext | Tombstone
) -> None:
    if isinstance(decoded, Tombstone):
        delete_memory(conn, memory_id)
    else:
        current = get_row(conn, memory_id)
        previous = (current["modified_at"], current["synced_at"]) if current else (None, None)
        apply_memory(conn, decoded)  # writes the kept version (as if synced) ...
        mark_edited(conn, memory_id, next_modified_at(decoded.modified_at, *previous))
        # ... then marks it a new local edit, so it is pushed with a fresh clock.
