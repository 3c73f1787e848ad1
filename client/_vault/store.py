"""The memories of a local vault, as the syncer and the CLI see them (VAULT §3, PROTOCOL §4).

Rows ↔ plaintexts, local edits (which bump `modified_at` and write tombstones),
what needs pushing, and applying pulled versions as received. Every function
takes the vault's connection and leaves transactions to the caller.
"""

from __future__ import annotations

import json
import sqlite3
import struct
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

import msgspec
import sqlcipher3

from engram_sync.shared_format.plaintext import (
    Link,
    MemoryPlaintext,
    decode_plaintext,
    encode_memory,
    tombstone_plaintext,
)
from engram_sync.shared_format.timestamps import format_rfc3339, parse_rfc3339, utc_now_rfc3339
from engram_sync.shared_format.vault.content_hash import normalized_hash

from .kept_digest import note_changing

DEFAULT_EMBEDDING_MODEL: Final = "all-MiniLM-L6-v2"

_ENGRAM_COLUMNS: Final = (
    "id, layer, source, privacy_level, content, context, strength, valence, retrievals,"
    " imagined, grounded, created_at, last_retrieved, project, tags, scope, content_type,"
    " occurred_at, modified_at, synced_at"
)

# PROTOCOL §8; a strict_local memory is never pushed, whatever its stamps (§8 "strict_local
# never leaves the device", docs/privacy.md)
STRICT_LOCAL: Final = "strict_local"
NEEDS_PUSH: Final = (
    "(privacy_level <> 'strict_local' AND (synced_at IS NULL OR modified_at > synced_at))"
)
_decode_json: Final = msgspec.json.decode


def named_rows(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
    """`sql` run on a cursor of its own whose rows read by column name; the connection's
    row factory is left as it is (the sync tables themselves: client._vault.schema)."""
    cursor = conn.cursor()
    cursor.row_factory = sqlcipher3.Row
    return cursor.execute(sql, params)


def new_memory_id() -> str:
    """`mem_` + the first 16 characters of a hyphenated UUIDv4 (VAULT §3)."""
    return "mem_" + str(uuid.uuid4())[:16]


# --- rows <-> plaintexts ---------------------------------------------------------------------


def _embedding_floats(blob: bytes) -> list[float]:
    count = len(blob) // 8
    return list(struct.unpack(f"<{count}d", blob[: count * 8]))


def _embedding_blob(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


def json_or(text: str | None, default: Any) -> Any:
    """The JSON value of a tags or context column, `default` when it is not JSON. msgspec's
    decoder first (a re-key reads every row: json.loads was a quarter of its row reading);
    what it refuses (NaN, Infinity, 1e400, a lone surrogate) json.loads decides, as before."""
    if text is None or text == "":
        return default
    try:
        return _decode_json(text)
    except msgspec.DecodeError:
        pass
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return default


def row_to_plaintext(conn: sqlite3.Connection, row: sqlite3.Row) -> MemoryPlaintext:
    """The PROTOCOL §4 plaintext of one engrams row, with its links and embedding."""
    links = [
        Link(link_type=r["link_type"], target_id=r["target_id"], weight=r["weight"])
        for r in named_rows(
            conn,
            "SELECT link_type, target_id, weight FROM engram_links WHERE source_id = ?"
            " ORDER BY target_id",
            (row["id"],),
        )
    ]
    emb = named_rows(
        conn, "SELECT embedding, model FROM engram_embeddings WHERE engram_id = ?", (row["id"],)
    ).fetchone()
    return plaintext_from(row, links, (bytes(emb["embedding"]), emb["model"]) if emb else None)


def plaintext_from(
    row: sqlite3.Row, links: list[Link], embedding: tuple[bytes, str] | None
) -> MemoryPlaintext:
    """The PROTOCOL §4 plaintext of an engrams row, given its links and (embedding, model)."""
    tags = json_or(row["tags"], [])
    return MemoryPlaintext(
        id=row["id"],
        content=row["content"],
        layer=row["layer"],
        scope=row["scope"],
        content_type=row["content_type"],
        source=row["source"],
        privacy_level=row["privacy_level"],
        context=json_or(row["context"], {}),
        created_at=row["created_at"],
        modified_at=row["modified_at"] or row["created_at"],
        last_retrieved=row["last_retrieved"],
        occurred_at=row["occurred_at"],
        project=row["project"],
        tags=[str(t) for t in tags] if isinstance(tags, list) else [],
        strength=float(row["strength"]),
        valence=float(row["valence"]),
        retrievals=int(row["retrievals"]),
        imagined=bool(row["imagined"]),
        grounded=bool(row["grounded"]),
        links=links,
        embedding=_embedding_floats(embedding[0]) if embedding else None,
        embedding_model=embedding[1] if embedding else None,
    )


def rows_of(conn: sqlite3.Connection, ids: list[str]) -> dict[str, sqlite3.Row]:
    """The engrams rows of `ids` (one query per 500 ids)."""
    found: dict[str, sqlite3.Row] = {}
    for start in range(0, len(ids), _IDS_PER_QUERY):
        chunk = ids[start : start + _IDS_PER_QUERY]
        marks = ", ".join("?" * len(chunk))
        query = f"SELECT {_ENGRAM_COLUMNS} FROM engrams WHERE id IN ({marks})"  # noqa: S608
        for row in named_rows(conn, query, chunk):
            found[row["id"]] = row
    return found


def memories_of_rows(
    conn: sqlite3.Connection, rows: list[sqlite3.Row], *, waiting: bool = True
) -> list[MemoryPlaintext]:
    """`row_to_plaintext` of each row (PROTOCOL §4), its links, waiting links (the links
    whose target this device does not hold, `sync_pending_links`, as the blob carried them;
    not with `waiting=False`, as row_to_plaintext) and embedding read in one query each per
    500 rows instead of two per row."""
    ids = [row["id"] for row in rows]
    links: dict[str, dict[str, Link]] = {i: {} for i in ids}
    embeddings: dict[str, tuple[bytes, str]] = {}
    for start in range(0, len(ids), _IDS_PER_QUERY):
        chunk = ids[start : start + _IDS_PER_QUERY]
        marks = ", ".join("?" * len(chunk))
        tables = ("engram_links", "sync_pending_links") if waiting else ("engram_links",)
        for table in tables:  # real links win over waiting
            query = (
                f"SELECT source_id, link_type, target_id, weight FROM {table}"  # noqa: S608
                f" WHERE source_id IN ({marks})"
            )
            for source, kind, target, weight in conn.execute(query, chunk):
                links[source].setdefault(
                    target, Link(link_type=kind, target_id=target, weight=weight)
                )
        query = (
            "SELECT engram_id, embedding, model FROM engram_embeddings"  # noqa: S608
            f" WHERE engram_id IN ({marks})"
        )
        for engram_id, blob, model in conn.execute(query, chunk):
            embeddings[engram_id] = (bytes(blob), model)
    return [
        plaintext_from(
            row,
            [links[row["id"]][t] for t in sorted(links[row["id"]])],
            embeddings.get(row["id"]),
        )
        for row in rows
    ]


def get_row(conn: sqlite3.Connection, memory_id: str) -> sqlite3.Row | None:
    """The engrams row of one memory, or None."""
    row: sqlite3.Row | None = named_rows(
        conn,
        f"SELECT rowid, {_ENGRAM_COLUMNS} FROM engrams WHERE id = ?",  # noqa: S608 - constants
        (memory_id,),
    ).fetchone()
    return row


def get_memory(conn: sqlite3.Connection, memory_id: str) -> MemoryPlaintext | None:
    """One memory as a plaintext, or None."""
    row = get_row(conn, memory_id)
    return None if row is None else row_to_plaintext(conn, row)


def list_memories(conn: sqlite3.Connection) -> list[MemoryPlaintext]:
    """Every memory, oldest first."""
    query = f"SELECT {_ENGRAM_COLUMNS} FROM engrams ORDER BY created_at, id"  # noqa: S608
    rows = named_rows(conn, query)
    return [row_to_plaintext(conn, r) for r in rows.fetchall()]


def recent_memories(
    conn: sqlite3.Connection, limit: int, project: str | None = None
) -> list[MemoryPlaintext]:
    """The `limit` most recently modified memories (of `project`), newest first (the
    modified_at index; ties by id)."""
    where = "" if project is None else " WHERE project = ?"
    query = (
        f"SELECT {_ENGRAM_COLUMNS} FROM engrams{where}"  # noqa: S608 - constants
        " ORDER BY modified_at DESC, id LIMIT ?"
    )
    params: list[Any] = [] if project is None else [project]
    rows = named_rows(conn, query, [*params, limit]).fetchall()
    return memories_of_rows(conn, rows)


def row_needs_push(row: sqlite3.Row) -> bool:
    """PROTOCOL §8: `synced_at IS NULL OR modified_at > synced_at`."""
    synced = row["synced_at"]
    return synced is None or (row["modified_at"] or "") > synced


# --- local edits -----------------------------------------------------------------------------


def _fts_delete(conn: sqlite3.Connection, memory_id: str) -> None:
    """Delete a memory's FTS row by id (VAULT §3).

    `WHERE id = ?` alone makes FTS5 scan every row (quadratic over a large pull); a
    phrase query on the id column uses the full-text index first, and the exact
    comparison keeps the delete precise. Ids with no letter or digit have no tokens
    to search for and take the scan.
    """
    if any(ch.isalnum() for ch in memory_id):
        phrase = 'id:"' + memory_id.replace('"', '""') + '"'
        conn.execute(
            "DELETE FROM engrams_fts WHERE engrams_fts MATCH ? AND id = ?", (phrase, memory_id)
        )
    else:
        conn.execute("DELETE FROM engrams_fts WHERE id = ?", (memory_id,))


def _fts_replace(conn: sqlite3.Connection, memory_id: str) -> None:
    # VAULT §3: engrams_fts is kept in sync by application code (delete by id, then
    # insert with the engram's rowid), not by triggers.
    _fts_delete(conn, memory_id)
    _fts_insert(conn, memory_id)


def _fts_insert(conn: sqlite3.Connection, memory_id: str) -> None:
    conn.execute(
        "INSERT INTO engrams_fts (rowid, id, content)"
        " SELECT rowid, id, content FROM engrams WHERE id = ?",
        (memory_id,),
    )


def next_modified_at(*previous: str | None) -> str:
    """Now, but strictly after every previous stamp (a remote clock may run ahead)."""
    stamp = utc_now_rfc3339()
    floor = None
    for text in previous:
        if text:
            try:
                instant = parse_rfc3339(text)
            except ValueError:
                continue
            floor = instant if floor is None else max(floor, instant)
    if floor is not None and parse_rfc3339(stamp) <= floor:
        stamp = format_rfc3339(floor + timedelta(microseconds=1))
    return stamp


def mark_edited(conn: sqlite3.Connection, memory_id: str, modified_at: str) -> None:
    """Set modified_at; if text order cannot show it as newer than synced_at, clear synced_at
    (a pulled row keeps the remote's spelling of its timestamps)."""
    conn.execute(
        "UPDATE engrams SET modified_at = ?,"
        " synced_at = CASE WHEN synced_at IS NOT NULL AND ? > synced_at THEN synced_at END"
        " WHERE id = ?",
        (modified_at, modified_at, memory_id),
    )


def add_memory(
    conn: sqlite3.Connection,
    content: str,
    *,
    layer: str = "episodic",
    source: str = "user",
    tags: Iterable[str] = (),
    project: str | None = None,
    scope: str = "moment",
    privacy_level: str = "cloud_first",
    context: Mapping[str, Any] | None = None,
) -> str:
    """Insert a new local memory (needs pushing, unless strict_local); returns its id.
    `context` is the memory's context object (VAULT §3: JSON text; `{}` when None)."""
    memory_id = new_memory_id()
    now = utc_now_rfc3339()
    conn.execute(
        "INSERT INTO engrams (id, layer, source, privacy_level, content, context, created_at,"
        " project, tags, content_hash, scope, content_type, modified_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'text', ?)",
        (
            memory_id,
            layer,
            source,
            privacy_level,
            content,
            json.dumps(dict(context or {}), ensure_ascii=False, sort_keys=True),
            now,
            project,
            json.dumps(list(tags), ensure_ascii=False),
            normalized_hash(content),
            scope,
            now,
        ),
    )
    _fts_insert(conn, memory_id)  # a new id: no full-text row to replace
    return memory_id


def edit_memory(conn: sqlite3.Connection, memory_id: str, content: str) -> bool:
    """Replace a memory's content as a local edit; False if there is no such memory."""
    row = get_row(conn, memory_id)
    if row is None:
        return False
    conn.execute(
        "UPDATE engrams SET content = ?, content_hash = ? WHERE id = ?",
        (content, normalized_hash(content), memory_id),
    )
    mark_edited(conn, memory_id, next_modified_at(row["modified_at"], row["synced_at"]))
    _fts_replace(conn, memory_id)
    return True


def stored_tags(row: sqlite3.Row) -> list[str]:
    """A row's tags (VAULT §3: a JSON array; [] when it is not one)."""
    tags = json_or(row["tags"], [])
    return tags if isinstance(tags, list) else []


def set_labels(
    conn: sqlite3.Connection,
    memory_id: str,
    *,
    tags: Sequence[str] | None = None,
    project: str | None = None,
    layer: str | None = None,
) -> bool:
    """Replace a memory's tags, project or layer (those given) as a local edit; False when
    there is no such memory or nothing changes (VAULT §3: tags a JSON array)."""
    row = get_row(conn, memory_id)
    if row is None:
        return False
    changes: dict[str, str] = {}
    if tags is not None and stored_tags(row) != list(tags):
        changes["tags"] = json.dumps(list(tags), ensure_ascii=False)
    if project is not None and row["project"] != project:
        changes["project"] = project
    if layer is not None and row["layer"] != layer:
        changes["layer"] = layer
    if not changes:
        return False
    assignments = ", ".join(f"{column} = ?" for column in changes)  # the three names above
    conn.execute(
        f"UPDATE engrams SET {assignments} WHERE id = ?",  # noqa: S608 - fixed column names
        (*changes.values(), memory_id),
    )
    mark_edited(conn, memory_id, next_modified_at(row["modified_at"], row["synced_at"]))
    return True


def link_memory(
    conn: sqlite3.Connection, source_id: str, target_id: str, link_type: str, weight: float
) -> bool:
    """Add (or replace) the link from `source_id` to `target_id` as a local edit of the
    source memory (links travel inside it, PROTOCOL §4); False when either is missing."""
    row = get_row(conn, source_id)
    if row is None or get_row(conn, target_id) is None:
        return False
    conn.execute(
        "INSERT OR REPLACE INTO engram_links (source_id, target_id, weight, link_type)"
        " VALUES (?, ?, ?, ?)",
        (source_id, target_id, weight, link_type),
    )
    mark_edited(conn, source_id, next_modified_at(row["modified_at"], row["synced_at"]))
    return True


def delete_memory(conn: sqlite3.Connection, memory_id: str) -> bool:
    """Delete locally and record a tombstone in the same transaction (VAULT §3). A
    strict_local memory's deletion stays local (PROTOCOL §8, docs/privacy.md): no tombstone,
    only a note in `sync_local_deletions`."""
    row = get_row(conn, memory_id)
    if row is None:
        return False
    _remove_row(conn, memory_id)
    if row["privacy_level"] == STRICT_LOCAL:
        conn.execute(
            "INSERT OR REPLACE INTO sync_local_deletions (memory_id, deleted_at) VALUES (?, ?)",
            (memory_id, utc_now_rfc3339()),
        )
        return True
    conn.execute(
        "INSERT OR REPLACE INTO tombstones (id, deleted_at) VALUES (?, ?)",
        (memory_id, utc_now_rfc3339()),
    )
    return True


def _remove_row(conn: sqlite3.Connection, memory_id: str) -> None:
    _fts_delete(conn, memory_id)
    conn.execute("DELETE FROM engrams WHERE id = ?", (memory_id,))  # links, embedding cascade
    conn.execute("DELETE FROM sync_pending_links WHERE source_id = ?", (memory_id,))


# --- pushing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PendingTombstone:
    """A local deletion the relay has not accepted yet."""

    memory_id: str
    deleted_at: str


_PUSH_KEY: Final = "coalesce(modified_at, '')"
_IDS_PER_QUERY: Final = 500  # under SQLite's historical limit of 999 parameters


def push_keys_query(*, after: bool) -> str:
    """The statement of `push_keys`; `after`: with the three parameters of a key to start
    after. Its WHERE is the partial index `sync_push_pending`'s (client schema migration 5,
    issue 36), so SQLite reads only the index's entries: the rows needing a push, whoever
    wrote them, already in push order."""
    query = f"SELECT {_PUSH_KEY}, id FROM engrams WHERE {NEEDS_PUSH}"  # noqa: S608 - constants
    if after:
        query += f" AND ({_PUSH_KEY} > ? OR ({_PUSH_KEY} = ? AND id > ?))"
    return query + f" ORDER BY {_PUSH_KEY}, id"


def push_keys(
    conn: sqlite3.Connection, after: tuple[str, str] | None = None
) -> list[tuple[str, str]]:
    """The (modified_at, id) keys of every row needing a push after `after`, oldest edit
    first (PROTOCOL §8): from the index of those rows (`push_keys_query`), O(rows to push)
    whatever the vault's size."""
    params = () if after is None else (after[0], after[0], after[1])
    query = push_keys_query(after=after is not None)
    return [(str(key), str(memory_id)) for key, memory_id in conn.execute(query, params)]


def rows_needing_push(conn: sqlite3.Connection, ids: Sequence[str]) -> list[sqlite3.Row]:
    """The rows of `ids` that still need a push (PROTOCOL §8), in the order of `ids`."""
    found: dict[str, sqlite3.Row] = {}
    for start in range(0, len(ids), _IDS_PER_QUERY):
        chunk = ids[start : start + _IDS_PER_QUERY]
        marks = ", ".join("?" * len(chunk))
        query = (
            f"SELECT {_ENGRAM_COLUMNS} FROM engrams"  # noqa: S608 - constants and placeholders
            f" WHERE id IN ({marks}) AND {NEEDS_PUSH}"
        )
        for row in named_rows(conn, query, tuple(chunk)):
            found[row["id"]] = row
    return [found[memory_id] for memory_id in ids if memory_id in found]


def count_to_push(conn: sqlite3.Connection) -> tuple[int, int]:
    """(rows needing a push, pending tombstones)."""
    query = f"SELECT count(*) FROM engrams WHERE {NEEDS_PUSH}"  # noqa: S608 - a constant
    rows = conn.execute(query).fetchone()[0]
    tombs = conn.execute("SELECT count(*) FROM tombstones").fetchone()[0]
    return int(rows), int(tombs)


def pending_tombstones(
    conn: sqlite3.Connection, limit: int, after: tuple[str, str] | None = None
) -> list[PendingTombstone]:
    """Local deletions to push, oldest first, after a (deleted_at, id) key."""
    deleted_at, last_id = after if after is not None else ("", "")
    return [
        PendingTombstone(r["id"], r["deleted_at"])
        for r in named_rows(
            conn,
            "SELECT id, deleted_at FROM tombstones"
            " WHERE deleted_at > ? OR (deleted_at = ? AND id > ?)"
            " ORDER BY deleted_at, id LIMIT ?",
            (deleted_at, deleted_at, last_id, limit),
        )
    ]


def mark_pushed(conn: sqlite3.Connection, memory_id: str, pushed_modified_at: str) -> None:
    """After the relay accepted a version: synced_at = the pushed modified_at (PROTOCOL §8)."""
    conn.execute("UPDATE engrams SET synced_at = ? WHERE id = ?", (pushed_modified_at, memory_id))


def mark_accepted(
    conn: sqlite3.Connection,
    stamps: Sequence[tuple[str, str | None]],
    versions: Sequence[tuple[str, KnownVersion]],
    *,
    deleted: bool,
) -> None:
    """After the relay accepted a batch (PROTOCOL §8): `mark_pushed` of each row (id,
    modified_at pushed; None: nothing to mark), or `clear_tombstone` of each tombstone (id,
    deleted_at), then `remember_version` of each version pushed: one statement each for the
    batch, not per memory (issue 36), the kept digest's notes taken first for the batch."""
    note_changing(conn, [memory_id for memory_id, _ in versions], fresh=False)
    if deleted:
        conn.executemany(
            "DELETE FROM tombstones WHERE id = ? AND deleted_at = ?",
            [(memory_id, stamp or "") for memory_id, stamp in stamps],
        )
    else:
        conn.executemany(
            "UPDATE engrams SET synced_at = ? WHERE id = ?",
            [(stamp, memory_id) for memory_id, stamp in stamps if stamp is not None],
        )
    conn.executemany(
        _REMEMBER,
        [(m, v.vector_clock, v.device_id, v.created_at) for m, v in versions],
    )


def clear_tombstone(conn: sqlite3.Connection, memory_id: str, deleted_at: str) -> None:
    """Forget a pushed tombstone (unless the memory was deleted again since)."""
    conn.execute("DELETE FROM tombstones WHERE id = ? AND deleted_at = ?", (memory_id, deleted_at))


def has_sync_history(conn: sqlite3.Connection) -> bool:
    """Whether this vault holds a version it pushed or pulled (a link before this one)."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM sync_known_clocks)"
        " OR EXISTS (SELECT 1 FROM engrams WHERE synced_at IS NOT NULL)"
    ).fetchone()
    return bool(row[0])


def repush_missing(
    conn: sqlite3.Connection, seen: dict[str, int], *, unseen_deletions: bool = False
) -> int:
    """Queue again every version this device holds that the relay lacks, after a full
    re-pull that saw `seen` (memory id -> highest verified clock on the relay).

    PROTOCOL §17, missing is not deleted: a pushed row the relay has no version of, or
    only a version older than the one this device knows, needs a push again; a deletion
    whose tombstone the relay lost while it still holds an older live version gets its
    tombstone pushed again. With `unseen_deletions` (the first pull of a new link, issue
    17) a deletion of a memory the relay has no version of at all is pushed too. Nothing
    is removed. Returns how many were queued.
    """
    conn.execute(
        "CREATE TEMP TABLE IF NOT EXISTS sync_seen (id TEXT PRIMARY KEY, clock INTEGER NOT NULL)"
    )
    conn.execute("DELETE FROM sync_seen")
    conn.executemany("INSERT INTO sync_seen (id, clock) VALUES (?, ?)", seen.items())
    rows = conn.execute(
        "UPDATE engrams SET synced_at = NULL WHERE synced_at IS NOT NULL"
        " AND privacy_level <> 'strict_local'"  # never pushed (docs/privacy.md)
        " AND NOT coalesce(modified_at > synced_at, 0) AND id IN ("
        " SELECT e.id FROM engrams e LEFT JOIN sync_seen s ON s.id = e.id"
        " LEFT JOIN sync_known_clocks k ON k.memory_id = e.id"
        " WHERE s.id IS NULL OR s.clock < coalesce(k.vector_clock, 0))"
    ).rowcount
    unseen = " OR s.id IS NULL" if unseen_deletions else ""
    tombs = conn.execute(
        "INSERT OR IGNORE INTO tombstones (id, deleted_at)"  # noqa: S608 - constants
        " SELECT k.memory_id, ? FROM sync_known_clocks k LEFT JOIN sync_seen s"
        f" ON s.id = k.memory_id WHERE (s.clock < k.vector_clock{unseen})"
        " AND k.memory_id NOT IN (SELECT id FROM engrams)"
        " AND k.memory_id NOT IN (SELECT memory_id FROM sync_local_deletions)",
        (utc_now_rfc3339(),),
    ).rowcount
    conn.execute("DELETE FROM sync_seen")
    return int(rows) + int(tombs)


# --- known clocks (LWW) ----------------------------------------------------------------------


@dataclass(frozen=True)
class KnownVersion:
    """The highest version this device applied or pushed for a memory."""

    vector_clock: int
    device_id: str
    created_at: str


def known_version(conn: sqlite3.Connection, memory_id: str) -> KnownVersion | None:
    """The memory's known version, or None."""
    row = conn.execute(
        "SELECT vector_clock, device_id, created_at FROM sync_known_clocks WHERE memory_id = ?",
        (memory_id,),
    ).fetchone()
    return None if row is None else KnownVersion(row[0], row[1], row[2])


_REMEMBER: Final = (
    "INSERT OR REPLACE INTO sync_known_clocks (memory_id, vector_clock, device_id, created_at)"
    " VALUES (?, ?, ?, ?)"
)


def remember_version(conn: sqlite3.Connection, memory_id: str, version: KnownVersion) -> None:
    """Record the version applied or pushed for a memory."""
    conn.execute(
        _REMEMBER, (memory_id, version.vector_clock, version.device_id, version.created_at)
    )


def remote_wins(remote: KnownVersion, known: KnownVersion | None) -> bool:
    """LWW (PROTOCOL §8): higher clock wins; equal clocks from different devices (legacy
    clients only) go to the later created_at as instants, then the higher device_id."""
    if known is None or remote.vector_clock > known.vector_clock:
        return True
    if remote.vector_clock < known.vector_clock or remote.device_id == known.device_id:
        return False
    return (_instant_key(remote.created_at), remote.device_id) > (
        _instant_key(known.created_at),
        known.device_id,
    )


def _instant_key(text: str) -> str:
    try:
        return format_rfc3339(parse_rfc3339(text))
    except ValueError:
        return ""


# --- applying pulled versions ----------------------------------------------------------------


@dataclass(frozen=True)
class LocalState:
    """What the vault holds of one memory, as a pulled version meets it."""

    exists: bool  # an engrams row or a tombstone
    # (plaintext, modified_at) of a local change not yet pushed; a pending local deletion
    # counts too (its plaintext is the tombstone's)
    unpushed: tuple[str, str | None] | None


def local_state(conn: sqlite3.Connection, memory_id: str) -> LocalState:
    """Whether the vault holds the memory, and its local change not yet pushed, if any."""
    row = get_row(conn, memory_id)
    if row is not None:
        if row_needs_push(row):
            plaintext = encode_memory(row_to_plaintext(conn, row))
            return LocalState(True, (plaintext, row["modified_at"]))
        return LocalState(True, None)
    tomb = conn.execute("SELECT deleted_at FROM tombstones WHERE id = ?", (memory_id,)).fetchone()
    if tomb is not None:
        return LocalState(True, (tombstone_plaintext(memory_id), tomb[0]))
    return LocalState(False, None)


def record_conflict(
    conn: sqlite3.Connection,
    memory_id: str,
    local_plaintext: str,
    local_modified_at: str | None,
    remote: KnownVersion,
    remote_deleted: bool,
) -> int:
    """Keep a losing local version in `sync_conflicts` (PROTOCOL §8: nothing lost silently);
    the row's id."""
    cursor = conn.execute(
        "INSERT INTO sync_conflicts (memory_id, local_plaintext, local_modified_at,"
        " remote_device_id, remote_vector_clock, remote_deleted, detected_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            memory_id,
            local_plaintext,
            local_modified_at,
            remote.device_id,
            remote.vector_clock,
            int(remote_deleted),
            utc_now_rfc3339(),
        ),
    )
    return int(cursor.lastrowid or 0)


def apply_tombstone(conn: sqlite3.Connection, memory_id: str) -> None:
    """A winning remote deletion: remove the row, without a local tombstone (PROTOCOL §8)."""
    _remove_row(conn, memory_id)
    conn.execute("DELETE FROM tombstones WHERE id = ?", (memory_id,))


APPLY_ROW: Final = (
    "INSERT INTO engrams (layer, source, privacy_level, content, context, strength, valence,"
    " retrievals, imagined, grounded, created_at, last_retrieved, project, tags,"
    " content_hash, scope, content_type, occurred_at, modified_at, synced_at, id)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET layer = excluded.layer, source = excluded.source,"
    " privacy_level = excluded.privacy_level, content = excluded.content,"
    " context = excluded.context, strength = excluded.strength,"
    " valence = excluded.valence, retrievals = excluded.retrievals,"
    " imagined = excluded.imagined, grounded = excluded.grounded,"
    " created_at = excluded.created_at, last_retrieved = excluded.last_retrieved,"
    " project = excluded.project, tags = excluded.tags,"
    " content_hash = excluded.content_hash, scope = excluded.scope,"
    " content_type = excluded.content_type, occurred_at = excluded.occurred_at,"
    " modified_at = excluded.modified_at, synced_at = excluded.synced_at"
)


def row_values(memory: MemoryPlaintext) -> tuple[Any, ...]:
    """The parameters of APPLY_ROW for a pulled memory, as received (PROTOCOL §4):
    synced_at = modified_at."""
    return (
        memory.layer,
        memory.source,
        memory.privacy_level,
        memory.content,
        json.dumps(memory.context, ensure_ascii=False, separators=(",", ":")),
        memory.strength,
        memory.valence,
        memory.retrievals,
        int(memory.imagined),
        int(memory.grounded),
        memory.created_at,
        memory.last_retrieved,
        memory.project,
        json.dumps(memory.tags, ensure_ascii=False),
        normalized_hash(memory.content),
        memory.scope,
        memory.content_type,
        memory.occurred_at,
        memory.modified_at,
        memory.modified_at,
        memory.id,
    )


def apply_memory(conn: sqlite3.Connection, memory: MemoryPlaintext, *, new: bool = False) -> None:
    """Write a winning remote memory as received (PROTOCOL §4): synced_at = modified_at.

    `new`: the vault holds nothing of this memory (no row, no tombstone; `local_state`),
    so there is no older version to clear: no tombstone, no full-text row (VAULT §3 keeps
    them with the rows), no links or embedding (they cascade with the row). A first pull
    of a large vault is all new memories, and skipping those deletes saves four of its
    statements per memory.
    """
    if not new:
        conn.execute("DELETE FROM tombstones WHERE id = ?", (memory.id,))
    conn.execute(APPLY_ROW, row_values(memory))
    if not new:
        _fts_delete(conn, memory.id)
    _fts_insert(conn, memory.id)
    _replace_links(conn, memory.id, memory.links, new=new)
    _replace_embedding(conn, memory, new=new)
    _resolve_pending_links(conn, memory.id)


def _replace_links(
    conn: sqlite3.Connection, memory_id: str, links: list[Link], *, new: bool
) -> None:
    if not new:  # a link to a strict_local memory never travels: it stays (privacy.md)
        conn.execute(
            "DELETE FROM engram_links WHERE source_id = ? AND target_id NOT IN"
            " (SELECT id FROM engrams WHERE privacy_level = 'strict_local')",
            (memory_id,),
        )
    # Pending links are ours (no foreign key): a row another program removed leaves them.
    conn.execute("DELETE FROM sync_pending_links WHERE source_id = ?", (memory_id,))
    for link in links:
        conn.execute(
            "INSERT OR REPLACE INTO sync_pending_links (source_id, target_id, link_type, weight)"
            " VALUES (?, ?, ?, ?)",
            (memory_id, link.target_id, link.link_type, link.weight),
        )


def _resolve_pending_links(conn: sqlite3.Connection, memory_id: str) -> None:
    """Materialise pending links whose two ends now exist (this memory as source or target)."""
    conn.execute(
        "INSERT OR REPLACE INTO engram_links (source_id, target_id, weight, link_type)"
        " SELECT p.source_id, p.target_id, p.weight, p.link_type FROM sync_pending_links p"
        " WHERE (p.source_id = ?1 OR p.target_id = ?1)"
        " AND EXISTS (SELECT 1 FROM engrams WHERE id = p.source_id)"
        " AND EXISTS (SELECT 1 FROM engrams WHERE id = p.target_id)",
        (memory_id,),
    )
    conn.execute(
        "DELETE FROM sync_pending_links WHERE (source_id = ?1 OR target_id = ?1)"
        " AND EXISTS (SELECT 1 FROM engrams WHERE id = source_id)"
        " AND EXISTS (SELECT 1 FROM engrams WHERE id = target_id)",
        (memory_id,),
    )


def _replace_embedding(conn: sqlite3.Connection, memory: MemoryPlaintext, *, new: bool) -> None:
    if memory.embedding is None:
        if not new:
            conn.execute("DELETE FROM engram_embeddings WHERE engram_id = ?", (memory.id,))
        return
    conn.execute(
        "INSERT OR REPLACE INTO engram_embeddings (engram_id, embedding, model, dimensions,"
        " created_at) VALUES (?, ?, ?, ?, ?)",
        (
            memory.id,
            _embedding_blob(memory.embedding),
            memory.embedding_model or DEFAULT_EMBEDDING_MODEL,
            len(memory.embedding),
            memory.modified_at,
        ),
    )


def plaintext_of(text: str, memory_id: str) -> MemoryPlaintext | None:
    """Decode a plaintext for display (a tombstone gives None)."""
    decoded = decode_plaintext(text, expected_id=memory_id)
    return decoded if isinstance(decoded, MemoryPlaintext) else None
