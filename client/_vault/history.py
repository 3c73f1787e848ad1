"""Local history: every version this device replaced, kept to list and bring back
(docs/history.md). Never synced, never exported; encrypted with the rest of `engrams.db`.

`keep_version` is called by every code path that replaces a version (a local edit or
deletion, a pulled version or deletion, a conflict restore, a restore, an undelete, a
revert) right before it writes, in the same transaction. It copies the version the vault
holds (the engrams row with its links and embedding, or a marker for a deletion) into
`sync_history` with who wrote it and who replaced it (`Writer`). Retention: `keep_days`
(30) for every row, and `max_percent` (10%) of the vault's size for the versions counted
against the cap, at least `min_bytes` (1 MiB); a memory's last version before a deletion
is not counted (it took that room in the vault before), so a mass deletion can be undone
for the whole retention time. Pruning removes the oldest rows first, a bounded number per
write (`PRUNE_PER_WRITE`), never by a scan of the vault.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from engram_sync.shared_format.plaintext import Link, MemoryPlaintext
from engram_sync.shared_format.timestamps import format_rfc3339, parse_rfc3339, utc_now_rfc3339

from .._errors import SyncError
from .store import (
    NEEDS_PUSH,
    apply_memory,
    get_memory,
    get_row,
    known_version,
    mark_edited,
    named_rows,
    next_modified_at,
    plaintext_from,
)

# why a version was replaced (the `reason` of its history row)
EDIT: Final = "edit"
DELETE: Final = "delete"
PULL: Final = "pull"
PULL_DELETE: Final = "pull-delete"
CONFLICT: Final = "conflict"
RESTORE: Final = "restore"
UNDELETE: Final = "undelete"
REVERT: Final = "revert"
_DELETIONS: Final = frozenset({DELETE, PULL_DELETE})

PRUNE_PER_WRITE: Final = 8  # rows pruned at most per version kept: bounded work per write

_SNAPSHOT_COLUMNS: Final = (
    "layer, source, privacy_level, content, context, strength, valence, retrievals, imagined,"
    " grounded, created_at, last_retrieved, project, tags, scope, content_type, occurred_at,"
    " modified_at"
)
_PROVENANCE_COLUMNS: Final = (
    "version, written_by, written_label, written_source, written_tool, written_at,"
    " new_by, new_label, new_source, new_tool, new_at, new_modified_at, replaced_at, reason,"
    " capped"
)
# the engrams row, its links (real and waiting, as memories_of_rows reads them) and its
# embedding, copied by SQLite in one statement (a pull keeps a version per blob it applies)
_SNAPSHOT_ROW: Final = (
    "WITH s AS (SELECT e.*, (SELECT json_group_array(json_array(l.link_type, l.target_id,"  # noqa: S608
    " l.weight)) FROM (SELECT link_type, target_id, weight FROM engram_links"
    " WHERE source_id = e.id UNION SELECT link_type, target_id, weight"
    " FROM sync_pending_links WHERE source_id = e.id) l) AS link_list,"
    " m.embedding AS emb, m.model AS emb_model"
    " FROM engrams e LEFT JOIN engram_embeddings m ON m.engram_id = e.id WHERE e.id = ?)"
    f" INSERT INTO sync_history (memory_id, deleted, {_SNAPSHOT_COLUMNS}, links, embedding,"
    f" embedding_model, {_PROVENANCE_COLUMNS}, size)"
    f" SELECT id, 0, {_SNAPSHOT_COLUMNS}, link_list, emb, emb_model,"
    " ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
    " 256 + length(CAST(content AS BLOB)) + length(CAST(context AS BLOB))"
    " + coalesce(length(CAST(tags AS BLOB)), 0) + length(CAST(link_list AS BLOB))"
    " + coalesce(length(emb), 0) FROM s RETURNING seq, size"
)
_MARKER_ROW: Final = (
    f"INSERT INTO sync_history (memory_id, deleted, {_PROVENANCE_COLUMNS}, size)"  # noqa: S608
    " VALUES (?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 128) RETURNING seq, size"
)


@dataclass(frozen=True)
class Writer:
    """Who wrote a version: the device (and its label when known), the memory's `source`
    and the AI tool named in its context (`tool_of`), and when (the writer's clock)."""

    device_id: str | None
    label: str | None = None
    source: str | None = None
    tool: str | None = None
    at: str | None = None


def local_writer(
    device_id: str, label: str | None, *, source: str = "user", tool: str | None = None
) -> Writer:
    """This device writing now, for `source` (and the AI tool, when one writes)."""
    return Writer(device_id, label, source, tool, utc_now_rfc3339())


@dataclass(frozen=True)
class Origin:
    """The writer of the version a vault holds now, and why it was written (None: the
    version is the memory's first here, or was written without history)."""

    writer: Writer
    reason: str | None
    version: int  # its number in `history` (the kept versions are 1 .. version - 1)


@dataclass(frozen=True)
class Version:
    """One version of a memory as `history` shows it (the current one last)."""

    version: int
    deleted: bool
    memory: MemoryPlaintext | None  # None for a deletion
    written: Writer
    replaced_at: str | None  # None for the current version
    replaced_by: Writer | None
    reason: str | None  # why it was replaced
    current: bool = False


@dataclass(frozen=True)
class Retention:
    """How long and how much history is kept (docs/history.md)."""

    keep_days: float = 30.0
    max_percent: float = 10.0
    min_bytes: int = 1 << 20


class HistoryError(SyncError):
    """A history request this vault cannot answer (no such memory or version)."""


def tool_of(context: Any) -> str | None:
    """The AI tool named in a memory's context: `context["tool"]` as a string, or its
    `name` (the MCP server writes `{"tool": {"name": ..., "version": ...}}`)."""
    if not isinstance(context, dict):
        return None
    tool = context.get("tool")
    if isinstance(tool, dict):
        tool = tool.get("name")
    return tool[:200] if isinstance(tool, str) and tool else None


def _context_tool(text: str | None) -> str | None:
    if not text:
        return None
    try:
        return tool_of(json.loads(text))
    except (ValueError, RecursionError):
        return None


def current_origin(conn: sqlite3.Connection, memory_id: str, own_device: str) -> Origin | None:
    """Who wrote the version of `memory_id` this vault holds now; None when it holds
    nothing of it (no row, no deletion it knows of)."""
    last = conn.execute(
        "SELECT version, new_by, new_label, new_source, new_tool, new_at, new_modified_at,"
        " reason FROM sync_history WHERE memory_id = ? ORDER BY seq DESC LIMIT 1",
        (memory_id,),
    ).fetchone()
    row = conn.execute(
        f"SELECT modified_at, source, context, {NEEDS_PUSH} FROM engrams"  # noqa: S608
        " WHERE id = ?",
        (memory_id,),
    ).fetchone()
    version = 1 if last is None else int(last[0]) + 1
    if last is not None and last[6] == (row[0] if row is not None else None):
        return Origin(Writer(last[1], last[2], last[3], last[4], last[5]), last[7], version)
    known = known_version(conn, memory_id)
    if row is not None:
        mine = bool(row[3]) or known is None
        writer = Writer(
            own_device if mine else known.device_id,  # type: ignore[union-attr]
            source=row[1],
            tool=_context_tool(row[2]),
            at=row[0] if mine else known.created_at,  # type: ignore[union-attr]
        )
        return Origin(writer, None, version)
    tomb = conn.execute("SELECT deleted_at FROM tombstones WHERE id = ?", (memory_id,)).fetchone()
    local = conn.execute(
        "SELECT deleted_at FROM sync_local_deletions WHERE memory_id = ?", (memory_id,)
    ).fetchone()
    if tomb is not None or local is not None:
        return Origin(Writer(own_device, at=(tomb or local)[0]), None, version)
    if known is not None:
        return Origin(Writer(known.device_id, at=known.created_at), None, version)
    return None


def keep_version(
    conn: sqlite3.Connection,
    memory_id: str,
    reason: str,
    new: Writer,
    *,
    own_device: str,
    new_modified_at: str | None = None,
    deletion: bool = False,
) -> int | None:
    """Keep the version of `memory_id` the vault holds, about to be replaced by `new`'s
    version (`new_modified_at`: its modified_at, None for a deletion or when not known yet:
    `replacing` fills it in; `deletion`: the new version is a deletion). Returns the
    history row, None when the vault holds nothing of the memory (its first version here
    replaces nothing)."""
    origin = current_origin(conn, memory_id, own_device)
    if origin is None:
        return None
    w = origin.writer
    provenance = (
        origin.version,
        w.device_id,
        w.label,
        w.source,
        w.tool,
        w.at,
        new.device_id,
        new.label,
        new.source,
        new.tool,
        new.at,
        new_modified_at,
        utc_now_rfc3339(),
        reason,
    )
    capped = not (deletion or reason in _DELETIONS)
    found = conn.execute(_SNAPSHOT_ROW, (memory_id, *provenance, int(capped))).fetchone()
    if found is None:  # a deletion replaced (an undelete, or a pulled version of it)
        found = conn.execute(_MARKER_ROW, (memory_id, *provenance, 1)).fetchone()
        capped = True
    seq, size = int(found[0]), int(found[1])
    if capped:
        conn.execute(
            "UPDATE sync_history_meta SET capped_bytes = capped_bytes + ? WHERE id = 1", (size,)
        )
    prune(conn, PRUNE_PER_WRITE)
    return seq


@contextmanager
def replacing(
    conn: sqlite3.Connection,
    memory_id: str,
    reason: str,
    new: Writer,
    *,
    own_device: str,
    deletion: bool = False,
) -> Iterator[None]:
    """Keep the current version of `memory_id`, then let the caller replace it; the new
    version's modified_at is recorded once written (a local write stamps it itself)."""
    seq = keep_version(conn, memory_id, reason, new, own_device=own_device, deletion=deletion)
    yield
    if seq is not None:
        conn.execute(
            "UPDATE sync_history SET new_modified_at ="
            " (SELECT modified_at FROM engrams WHERE id = ?) WHERE seq = ?",
            (memory_id, seq),
        )


# --- retention -------------------------------------------------------------------------------


def retention(conn: sqlite3.Connection) -> Retention:
    """The vault's retention settings."""
    row = conn.execute(
        "SELECT keep_days, max_percent, min_bytes FROM sync_history_meta WHERE id = 1"
    ).fetchone()
    return Retention() if row is None else Retention(float(row[0]), float(row[1]), int(row[2]))


def set_retention(conn: sqlite3.Connection, value: Retention) -> None:
    """Change the retention settings (the next writes prune to them, a bounded step each)."""
    if not 0 < value.keep_days <= 36500:
        raise HistoryError("the days to keep must be more than 0 (and at most 36500)")
    if not 0 <= value.max_percent <= 1000:
        raise HistoryError("the size cap must be between 0 and 1000 percent of the vault")
    if value.min_bytes < 0:
        raise HistoryError("the minimum size must not be negative")
    conn.execute(
        "UPDATE sync_history_meta SET keep_days = ?, max_percent = ?, min_bytes = ? WHERE id = 1",
        (value.keep_days, value.max_percent, value.min_bytes),
    )


def vault_bytes(conn: sqlite3.Connection) -> int:
    """The bytes the vault's database uses (its pages, less the free ones): O(1)."""
    pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
    free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    return (pages - free) * size


def cap_bytes(conn: sqlite3.Connection, settings: Retention | None = None) -> int:
    """The most bytes of capped history the vault keeps now."""
    value = settings or retention(conn)
    return max(value.min_bytes, int(vault_bytes(conn) * value.max_percent / 100))


def capped_bytes(conn: sqlite3.Connection) -> int:
    """The bytes of the history rows counted against the cap."""
    row = conn.execute("SELECT capped_bytes FROM sync_history_meta WHERE id = 1").fetchone()
    return 0 if row is None else int(row[0])


def prune(conn: sqlite3.Connection, budget: int) -> int:
    """Remove at most `budget` rows: first those older than the retention days (oldest
    first), then the oldest capped rows while the capped bytes exceed the cap. Returns
    how many were removed."""
    settings = retention(conn)
    cutoff = format_rfc3339(parse_rfc3339(utc_now_rfc3339()) - timedelta(days=settings.keep_days))
    removed = 0
    oldest = conn.execute(
        "SELECT seq, replaced_at FROM sync_history ORDER BY seq LIMIT ?", (budget,)
    ).fetchall()
    expired = []
    for seq, replaced_at in oldest:
        if replaced_at >= cutoff:
            break  # kept in the order they were replaced: the rest are younger
        expired.append(seq)
    if expired:
        marks = ", ".join("?" * len(expired))
        removed += _remove(conn, f"seq IN ({marks})", expired)
    while removed < budget and capped_bytes(conn) > cap_bytes(conn, settings):
        step = min(budget - removed, PRUNE_PER_WRITE)
        removed += _remove(
            conn,
            "seq IN (SELECT seq FROM sync_history WHERE capped = 1 ORDER BY seq LIMIT ?)",
            [step],
        )
    return removed


def _remove(conn: sqlite3.Connection, where: str, params: list[Any]) -> int:
    gone = conn.execute(
        f"DELETE FROM sync_history WHERE {where} RETURNING size, capped, replaced_at",  # noqa: S608
        params,
    ).fetchall()
    if not gone:
        return 0
    freed = sum(int(size) for size, capped, _ in gone if capped)
    newest = max(str(at) for _, _, at in gone)
    conn.execute(
        "UPDATE sync_history_meta SET capped_bytes = max(0, capped_bytes - ?),"
        " horizon = max(coalesce(horizon, ''), ?) WHERE id = 1",
        (freed, newest),
    )
    return len(gone)


def horizon(conn: sqlite3.Connection) -> str | None:
    """The newest time a pruned version had been replaced at: before it, a memory's
    history may be incomplete (None: nothing was ever pruned)."""
    row = conn.execute("SELECT horizon FROM sync_history_meta WHERE id = 1").fetchone()
    return None if row is None or row[0] is None else str(row[0])


# --- reading and bringing back ------------------------------------------------------------


def _memory_of(row: sqlite3.Row) -> MemoryPlaintext:
    links = [
        Link(link_type=kind, target_id=str(target), weight=float(weight))
        for kind, target, weight in json.loads(row["links"] or "[]")
    ]
    embedding = (
        None if row["embedding"] is None else (bytes(row["embedding"]), row["embedding_model"])
    )
    return plaintext_from(row, sorted(links, key=lambda link: link.target_id), embedding)


def written_of(row: sqlite3.Row) -> Writer:
    return Writer(
        row["written_by"], row["written_label"], row["written_source"], row["written_tool"],
        row["written_at"],
    )  # fmt: skip


def _replaced_by(row: sqlite3.Row) -> Writer:
    return Writer(
        row["new_by"], row["new_label"], row["new_source"], row["new_tool"], row["new_at"]
    )


def kept_rows(conn: sqlite3.Connection, memory_id: str) -> list[sqlite3.Row]:
    """The history rows of one memory, oldest first."""
    return named_rows(
        conn,
        "SELECT *, memory_id AS id FROM sync_history WHERE memory_id = ? ORDER BY seq",
        (memory_id,),
    ).fetchall()


def versions(conn: sqlite3.Connection, memory_id: str, own_device: str) -> list[Version]:
    """The kept versions of a memory, oldest first, then the one the vault holds now
    (its deletion, when deleted). Empty when the vault knows nothing of it."""
    found = [
        Version(
            version=int(row["version"]),
            deleted=bool(row["deleted"]),
            memory=None if row["deleted"] else _memory_of(row),
            written=written_of(row),
            replaced_at=row["replaced_at"],
            replaced_by=_replaced_by(row),
            reason=row["reason"],
        )
        for row in kept_rows(conn, memory_id)
    ]
    origin = current_origin(conn, memory_id, own_device)
    if origin is not None:
        memory = get_memory(conn, memory_id)
        found.append(
            Version(origin.version, memory is None, memory, origin.writer, None, None, None, True)
        )
    return found


def _kept(conn: sqlite3.Connection, memory_id: str, version: int | None) -> sqlite3.Row:
    """A kept live version: `version`, or the newest one (None)."""
    query = "SELECT *, memory_id AS id FROM sync_history WHERE memory_id = ? AND deleted = 0"
    params: tuple[Any, ...] = (memory_id,)
    if version is not None:
        query += " AND version = ?"
        params = (memory_id, version)
    row: sqlite3.Row | None = named_rows(
        conn, query + " ORDER BY seq DESC LIMIT 1", params
    ).fetchone()
    if row is None:
        if version is None:
            raise HistoryError(
                f"no earlier version of {memory_id!r} is kept on this device"
                " (`engram-sync history ID` lists what is)"
            )
        raise HistoryError(
            f"{memory_id!r} has no kept version {version}"
            " (a deletion, pruned, or never here: `engram-sync history ID` lists them)"
        )
    return row


def write_back(
    conn: sqlite3.Connection, row: sqlite3.Row, reason: str, by: Writer, *, own_device: str
) -> None:
    """Write a kept version as a new local version (a new clock at the next push, so it
    wins everywhere and syncs like an edit); the version it replaces is kept in turn."""
    memory = _memory_of(row)
    current = get_row(conn, memory.id)
    previous = (current["modified_at"], current["synced_at"]) if current else (None, None)
    known = known_version(conn, memory.id)
    with replacing(conn, memory.id, reason, by, own_device=own_device):
        apply_memory(conn, memory)  # written as if synced ...
        stamp = next_modified_at(memory.modified_at, *previous, known.created_at if known else None)
        mark_edited(conn, memory.id, stamp)  # ... then made a new local edit
        conn.execute("DELETE FROM sync_local_deletions WHERE memory_id = ?", (memory.id,))


def restore(
    conn: sqlite3.Connection, memory_id: str, version: int, by: Writer, *, own_device: str
) -> None:
    """Bring kept version `version` of a memory back as its newest version."""
    write_back(conn, _kept(conn, memory_id, version), RESTORE, by, own_device=own_device)


def undelete(conn: sqlite3.Connection, memory_id: str, by: Writer, *, own_device: str) -> None:
    """Bring a deleted memory back: its newest kept version, as a new version."""
    if get_row(conn, memory_id) is not None:
        raise HistoryError(f"{memory_id!r} is not deleted")
    write_back(conn, _kept(conn, memory_id, None), UNDELETE, by, own_device=own_device)
