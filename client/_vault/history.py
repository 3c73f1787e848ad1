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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from engram_sync.shared_format.plaintext import Link, MemoryPlaintext
from engram_sync.shared_format.timestamps import format_rfc3339, utc_now_rfc3339

from .._errors import SyncError
from .store import (
    NEEDS_PUSH,
    KnownVersion,
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
# The same row for a memory without links or embedding (most of them), in a statement that
# costs a third of the one above: no CTE, no subqueries, no RETURNING (`_LINKED` decides).
_BARE_ROW: Final = (
    f"INSERT INTO sync_history (memory_id, deleted, {_SNAPSHOT_COLUMNS}, links,"  # noqa: S608
    f" {_PROVENANCE_COLUMNS}, size) SELECT id, 0, {_SNAPSHOT_COLUMNS}, '[]',"
    " ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
    " 256 + length(CAST(content AS BLOB)) + length(CAST(context AS BLOB))"
    " + coalesce(length(CAST(tags AS BLOB)), 0) + 2 FROM engrams WHERE id = ?"
)
_LINKED: Final = (
    "SELECT EXISTS (SELECT 1 FROM engram_links WHERE source_id = ?1)"
    " OR EXISTS (SELECT 1 FROM sync_pending_links WHERE source_id = ?1)"
    " OR EXISTS (SELECT 1 FROM engram_embeddings WHERE engram_id = ?1)"
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
    known = known_version(conn, memory_id)

    def deleted_at() -> str | None:
        tomb = conn.execute(
            "SELECT deleted_at FROM tombstones WHERE id = ?", (memory_id,)
        ).fetchone()
        local = conn.execute(
            "SELECT deleted_at FROM sync_local_deletions WHERE memory_id = ?", (memory_id,)
        ).fetchone()
        found = tomb or local
        return None if found is None else found[0]

    return _origin_of(last, row, known, deleted_at, own_device)


def _origin_of(
    last: Any,
    row: Any,
    known: KnownVersion | None,
    deleted_at: Callable[[], str | None],
    own_device: str,
) -> Origin | None:
    """`current_origin` from what it reads: the memory's last history row, its engrams row
    (modified_at, source, context, needs push), its known version, and `deleted_at()`: the
    time of its local tombstone or local deletion (read only when there is no row)."""
    version = 1 if last is None else int(last[0]) + 1
    if last is not None and last[6] == (row[0] if row is not None else None):
        return Origin(Writer(last[1], last[2], last[3], last[4], last[5]), last[7], version)
    if row is not None:
        mine = bool(row[3]) or known is None
        writer = Writer(
            own_device if mine else known.device_id,  # type: ignore[union-attr]
            source=row[1],
            tool=_context_tool(row[2]),
            at=row[0] if mine else known.created_at,  # type: ignore[union-attr]
        )
        return Origin(writer, None, version)
    at = deleted_at()
    if at is not None:
        return Origin(Writer(own_device, at=at), None, version)
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
    found: tuple[Any, ...] | None = None
    if conn.execute(_LINKED, (memory_id,)).fetchone()[0]:
        found = conn.execute(_SNAPSHOT_ROW, (memory_id, *provenance, int(capped))).fetchone()
    else:
        added = conn.execute(_BARE_ROW, (*provenance, int(capped), memory_id))
        if added.rowcount == 1:
            found = (added.lastrowid, None)  # its size: read by the UPDATE below
    if found is None:  # a deletion replaced (an undelete, or a pulled version of it)
        found = tuple(conn.execute(_MARKER_ROW, (memory_id, *provenance, 1)).fetchone())
        capped = True
    seq = int(found[0])
    if capped:
        conn.execute(
            "UPDATE sync_history_meta SET capped_bytes = capped_bytes +"
            " coalesce(?, (SELECT size FROM sync_history WHERE seq = ?)) WHERE id = 1",
            (found[1], seq),
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


# --- a page of pulled blobs -----------------------------------------------------------------

# One page's reads in bulk (PageKeeper): each memory's snapshot and origin columns, its
# last history row, its local deletion; then the page's history rows in one executemany.
_STAGE_ROWS: Final = (
    "WITH s AS (SELECT e.*, (SELECT json_group_array(json_array(l.link_type, l.target_id,"  # noqa: S608
    " l.weight)) FROM (SELECT link_type, target_id, weight FROM engram_links"
    " WHERE source_id = e.id UNION SELECT link_type, target_id, weight"
    " FROM sync_pending_links WHERE source_id = e.id) l) AS link_list,"
    " m.embedding AS emb, m.model AS emb_model"
    " FROM engrams e LEFT JOIN engram_embeddings m ON m.engram_id = e.id"
    " WHERE e.id IN (SELECT value FROM json_each(?)))"
    f" SELECT id, modified_at, source, context, {NEEDS_PUSH}, {_SNAPSHOT_COLUMNS}, link_list,"
    " emb, emb_model, 256 + length(CAST(content AS BLOB)) + length(CAST(context AS BLOB))"
    " + coalesce(length(CAST(tags AS BLOB)), 0) + length(CAST(link_list AS BLOB))"
    " + coalesce(length(emb), 0) FROM s"
)
_STAGE_LAST: Final = (
    "SELECT h.memory_id, h.version, h.new_by, h.new_label, h.new_source, h.new_tool, h.new_at,"
    " h.new_modified_at, h.reason FROM (SELECT value AS id FROM json_each(?)) i"
    " JOIN sync_history h ON h.seq ="
    " (SELECT max(seq) FROM sync_history WHERE memory_id = i.id)"
)
_STAGE_TOMBS: Final = (
    "SELECT id, deleted_at FROM tombstones WHERE id IN (SELECT value FROM json_each(?))"
)
_STAGE_LOCAL: Final = (
    "SELECT memory_id, deleted_at FROM sync_local_deletions"
    " WHERE memory_id IN (SELECT value FROM json_each(?))"
)
_SNAPSHOT_WIDTH: Final = len(_SNAPSHOT_COLUMNS.split(",")) + 3  # + links, embedding, model
_PAGE_ROW: Final = (
    f"INSERT INTO sync_history (memory_id, deleted, {_SNAPSHOT_COLUMNS}, links, embedding,"  # noqa: S608
    f" embedding_model, {_PROVENANCE_COLUMNS}, size) VALUES"
    f" ({', '.join('?' * (2 + _SNAPSHOT_WIDTH + 15 + 1))})"
)


@dataclass
class _Staged:
    row: tuple[Any, ...] | None  # modified_at, source, context, needs push; None: no row
    snapshot: tuple[Any, ...] | None  # the snapshot columns, links, embedding, model
    size: int
    last: tuple[Any, ...] | None  # its last history row (version .. reason)
    deleted_at: str | None  # its tombstone's or local deletion's time


class PageKeeper:
    """`keep_version` for the versions one page of pulled blobs replaces, its work done in
    bulk (a pull keeps a version per blob it applies): the first `keep` reads the page's
    memories in four queries, and `flush` (before the page's transaction commits) writes
    their history rows in one executemany, adds their sizes once and prunes once, at most
    PRUNE_PER_WRITE rows per version kept (bounded work, as per write).

    The rows, their order (seq), versions and provenance are those `keep_version` writes:
    a memory is read ahead only when nothing else the page applies can change what is
    read of it (it appears once in the page, and has no links, which another memory's
    deletion would cascade away); any other memory goes through `keep_version` itself,
    after a flush, so the history rows keep the order of the replacements."""

    def __init__(self, conn: sqlite3.Connection, memory_ids: Sequence[str], own_device: str):
        self.conn, self.own_device = conn, own_device
        self._ids = memory_ids
        self._staged: dict[str, _Staged] | None = None  # read at the first keep
        self._rows: list[tuple[Any, ...]] = []
        self._capped = 0

    def _stage(self) -> dict[str, _Staged]:
        counts: dict[str, int] = {}
        for memory_id in self._ids:
            counts[memory_id] = counts.get(memory_id, 0) + 1
        once = [memory_id for memory_id, n in counts.items() if n == 1]
        if not once:
            return {}
        ids = json.dumps(once)
        rows = {str(r[0]): r for r in self.conn.execute(_STAGE_ROWS, (ids,))}
        last = {str(r[0]): tuple(r[1:]) for r in self.conn.execute(_STAGE_LAST, (ids,))}
        deleted = {str(r[0]): r[1] for r in self.conn.execute(_STAGE_LOCAL, (ids,))}
        deleted.update((str(r[0]), r[1]) for r in self.conn.execute(_STAGE_TOMBS, (ids,)))
        staged: dict[str, _Staged] = {}
        for memory_id in once:
            found = rows.get(memory_id)
            if found is not None and found[5 + _SNAPSHOT_WIDTH - 3] != "[]":
                continue  # linked: another memory's deletion may change what is kept
            staged[memory_id] = _Staged(
                row=None if found is None else tuple(found[1:5]),
                snapshot=None if found is None else tuple(found[5 : 5 + _SNAPSHOT_WIDTH]),
                size=0 if found is None else int(found[5 + _SNAPSHOT_WIDTH]),
                last=last.get(memory_id),
                deleted_at=deleted.get(memory_id),
            )
        return staged

    def keep(
        self,
        memory_id: str,
        reason: str,
        new: Writer,
        known: KnownVersion | None,
        *,
        new_modified_at: str | None = None,
        deletion: bool = False,
    ) -> None:
        """`keep_version(conn, memory_id, reason, new, ...)`, `known`: the memory's known
        version (its sync_known_clocks row) as it is now."""
        if self._staged is None:
            self._staged = self._stage()
        staged = self._staged.pop(memory_id, None)
        if staged is None:
            self.flush()
            keep_version(
                self.conn, memory_id, reason, new, own_device=self.own_device,
                new_modified_at=new_modified_at, deletion=deletion,
            )  # fmt: skip
            return
        origin = _origin_of(
            staged.last, staged.row, known, lambda: staged.deleted_at, self.own_device
        )
        if origin is None:
            return
        w = origin.writer
        provenance = (
            origin.version, w.device_id, w.label, w.source, w.tool, w.at,
            new.device_id, new.label, new.source, new.tool, new.at, new_modified_at,
            utc_now_rfc3339(), reason,
        )  # fmt: skip
        if staged.snapshot is not None:
            capped = not (deletion or reason in _DELETIONS)
            row = (memory_id, 0, *staged.snapshot, *provenance, int(capped), staged.size)
            size = staged.size
        else:  # a deletion replaced: its marker
            capped, size = True, 128
            row = (memory_id, 1, *([None] * _SNAPSHOT_WIDTH), *provenance, 1, size)
        self._rows.append(row)
        if capped:
            self._capped += size

    def flush(self) -> None:
        """Write the history rows kept so far, then prune (in the caller's transaction)."""
        if not self._rows:
            return
        self.conn.executemany(_PAGE_ROW, self._rows)
        if self._capped:
            self.conn.execute(
                "UPDATE sync_history_meta SET capped_bytes = capped_bytes + ? WHERE id = 1",
                (self._capped,),
            )
        budget = PRUNE_PER_WRITE * len(self._rows)
        self._rows, self._capped = [], 0
        prune(self.conn, budget)


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
    cutoff = format_rfc3339(datetime.now(UTC) - timedelta(days=settings.keep_days))
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
    while removed < budget and _over_cap(conn, settings):
        step = min(budget - removed, PRUNE_PER_WRITE)
        removed += _remove(
            conn,
            "seq IN (SELECT seq FROM sync_history WHERE capped = 1 ORDER BY seq LIMIT ?)",
            [step],
        )
    return removed


def _over_cap(conn: sqlite3.Connection, settings: Retention) -> bool:
    used = capped_bytes(conn)
    if used <= settings.min_bytes:  # within any cap: the vault's size is not read
        return False
    return used > cap_bytes(conn, settings)


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
    # no row and no tombstone (a deletion pulled, or a strict_local one): nothing of an
    # older version to clear (its full-text row, links and embedding went with its row)
    new = (
        current is None
        and not conn.execute("SELECT 1 FROM tombstones WHERE id = ?", (memory.id,)).fetchone()
    )
    with replacing(conn, memory.id, reason, by, own_device=own_device):
        apply_memory(conn, memory, new=new)  # written as if synced ...
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
