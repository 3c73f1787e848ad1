"""The privacy level of a memory, as sync applies it (PROTOCOL §8 "strict_local never leaves
the device"; docs/privacy.md).

`strict_local` memories are never sealed or pushed (client._vault.store.NEEDS_PUSH), their
deletion stays local (`sync_local_deletions`), and a pulled version never overwrites them
(client._sync.strict_local). What the relay already holds of one stays there until the
person retracts it (`queue_retraction`: a tombstone, pushed by the next sync, while the
local memory stays). The other three levels sync as before.
"""

from __future__ import annotations

import sqlite3
from typing import Final

import msgspec

from engram_sync.shared_format.plaintext import MemoryPlaintext
from engram_sync.shared_format.vault import PRIVACY_LEVELS

from .store import (
    STRICT_LOCAL,
    get_row,
    mark_edited,
    next_modified_at,
)

__all__ = [
    "PRIVACY_LEVELS",
    "STRICT_LOCAL",
    "RetractRefusedError",
    "forget_kept_local_clocks",
    "keeps_local",
    "kept_local_ids",
    "level_change_notice",
    "local_only_count",
    "mark_retracted",
    "pending_retractions",
    "queue_retraction",
    "set_privacy",
    "without_local_links",
]

_KEPT_LOCAL: Final = (
    "SELECT id FROM engrams WHERE privacy_level = 'strict_local'"
    " UNION SELECT memory_id FROM sync_local_deletions"
)


def set_privacy(conn: sqlite3.Connection, memory_id: str, level: str) -> str | None:
    """Change a memory's level as a local edit (a memory made syncing again is pushed by the
    next sync); returns the previous level, or None when there is no such memory."""
    if level not in PRIVACY_LEVELS:
        raise ValueError(f"privacy level must be one of {', '.join(PRIVACY_LEVELS)}")
    row = get_row(conn, memory_id)
    if row is None:
        return None
    previous: str = row["privacy_level"]
    if previous == level:
        return previous
    conn.execute("UPDATE engrams SET privacy_level = ? WHERE id = ?", (level, memory_id))
    mark_edited(conn, memory_id, next_modified_at(row["modified_at"], row["synced_at"]))
    return previous


def level_change_notice(conn: sqlite3.Connection, memory_id: str, previous: str, level: str) -> str:
    """What the person is told when a memory's level changed (docs/privacy.md)."""
    if level == STRICT_LOCAL and previous != STRICT_LOCAL:
        synced = conn.execute(
            "SELECT 1 FROM sync_known_clocks WHERE memory_id = ?", (memory_id,)
        ).fetchone()
        if synced is None:
            return f"{memory_id} is now strict_local: it never leaves this device"
        return (
            f"{memory_id} is now strict_local: its later versions stay on this device; its "
            "copy already synced stays on the relay and other devices; "
            f"`engram-sync retract {memory_id}` removes it there"
        )
    if previous == STRICT_LOCAL and level != STRICT_LOCAL:
        return f"{memory_id} is now {level}: the next sync pushes it"
    return f"{memory_id} is now {level}"


def keeps_local(conn: sqlite3.Connection, memory_id: str) -> bool:
    """Whether this device keeps the memory local: a strict_local row, or a strict_local
    memory deleted here only."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM engrams WHERE id = ?1 AND privacy_level = 'strict_local')"
        " OR EXISTS (SELECT 1 FROM sync_local_deletions WHERE memory_id = ?1)",
        (memory_id,),
    ).fetchone()
    return bool(row[0])


def local_only_count(conn: sqlite3.Connection) -> int:
    """How many memories of the vault are strict_local (never pushed)."""
    row = conn.execute(
        "SELECT count(*) FROM engrams WHERE privacy_level = 'strict_local'"
    ).fetchone()
    return int(row[0])


class RetractRefusedError(ValueError):
    """A memory `retract` cannot take, and why (one line for the person)."""


def queue_retraction(conn: sqlite3.Connection, memory_id: str) -> None:
    """Queue a tombstone for a memory kept local, to remove the copy the relay and the other
    devices hold; the local memory stays (`engram-sync retract`). RetractRefusedError when it is
    not a memory this device keeps local."""
    if not keeps_local(conn, memory_id):
        row = get_row(conn, memory_id)
        if row is None:
            raise RetractRefusedError(f"no memory {memory_id!r}; `engram-sync list` shows the ids")
        raise RetractRefusedError(
            f"{memory_id} is {row['privacy_level']}, not strict_local: `engram-sync delete "
            f"{memory_id}` deletes it everywhere, or `engram-sync edit {memory_id} --privacy "
            "strict_local` first"
        )
    synced = conn.execute(
        "SELECT 1 FROM sync_known_clocks WHERE memory_id = ?", (memory_id,)
    ).fetchone()
    if synced is None:  # its id never left: a tombstone would send it (docs/privacy.md)
        raise RetractRefusedError(
            f"{memory_id} never synced: there is no copy elsewhere to retract, it never "
            "leaves this device"
        )
    conn.execute(
        "INSERT OR REPLACE INTO sync_retractions (memory_id, vector_clock) VALUES (?, NULL)",
        (memory_id,),
    )


def pending_retractions(conn: sqlite3.Connection) -> list[str]:
    """Retractions not pushed yet, of memories still kept local."""
    # each queued retraction looked up by key (issue 36: `IN (_KEPT_LOCAL)` built the set of
    # every strict_local memory, a scan of engrams at every sync)
    rows = conn.execute(
        "SELECT r.memory_id FROM sync_retractions r WHERE r.vector_clock IS NULL AND ("
        " EXISTS (SELECT 1 FROM engrams e WHERE e.id = r.memory_id"
        " AND e.privacy_level = 'strict_local')"
        " OR EXISTS (SELECT 1 FROM sync_local_deletions d WHERE d.memory_id = r.memory_id))"
        " ORDER BY r.memory_id"
    ).fetchall()
    return [str(r[0]) for r in rows]


def mark_retracted(conn: sqlite3.Connection, memory_id: str, vector_clock: int) -> None:
    """The relay's version of a memory kept local is a deletion at `vector_clock` (a pushed
    retraction, or another device's tombstone kept out): the digest counts it deleted."""
    conn.execute(
        "INSERT OR REPLACE INTO sync_retractions (memory_id, vector_clock) VALUES (?, ?)",
        (memory_id, vector_clock),
    )


def forget_kept_local_clocks(conn: sqlite3.Connection) -> int:
    """After a re-key that did not copy them (docs/privacy.md): the new vault holds nothing
    of the memories kept local, so their known versions (what the old vault was given) and
    retractions are forgotten. Returns how many."""
    forgotten = conn.execute(
        f"DELETE FROM sync_known_clocks WHERE memory_id IN ({_KEPT_LOCAL})"  # noqa: S608
        " AND memory_id NOT IN (SELECT memory_id FROM sync_retractions"
        " WHERE vector_clock IS NOT NULL)"
    ).rowcount
    return int(forgotten)


def kept_local_ids(conn: sqlite3.Connection) -> set[str]:
    """The ids of every memory this device keeps local (a re-key copies none of them)."""
    return {str(r[0]) for r in conn.execute(_KEPT_LOCAL)}


def without_local_links(conn: sqlite3.Connection, memory: MemoryPlaintext) -> MemoryPlaintext:
    """The memory as it is pushed: without its links to memories this device keeps local
    (a strict_local memory's id does not travel in another memory either; the link stays in
    this vault: client._vault.store keeps it when a pulled version replaces the links)."""
    if not memory.links:
        return memory
    targets = [link.target_id for link in memory.links]
    marks = ", ".join("?" * len(targets))
    local = {
        str(r[0])
        for r in conn.execute(
            f"SELECT id FROM engrams WHERE privacy_level = 'strict_local' AND id IN ({marks})",  # noqa: S608
            targets,
        )
    }
    if not local:
        return memory
    kept = [link for link in memory.links if link.target_id not in local]
    return msgspec.structs.replace(memory, links=kept)
