"""Pulled versions of memories the vault holds nothing of, applied in bulk (issue 36).

A first pull of a large vault is almost all such memories: no row, no tombstone, no known
clock, no local deletion (`fresh_ids`). For them every step of the per-blob path
(client._sync.engine `_apply_blob`) is decided before it runs: the remote version wins LWW
(PROTOCOL §8, nothing known), nothing is kept local (docs/privacy.md), no unpushed local
change can conflict, and no replaced version goes to the history (docs/history.md). So
`FreshBatch` writes what that path writes, the same rows with the same values
(`store.APPLY_ROW`, `store.row_values`), in a few statements per batch instead of about
ten per memory: the rows with their rowids given (their full-text rows read back inside
SQLite, VAULT §3), links waiting in `sync_pending_links` and resolved once, embeddings,
and the known clocks last (so the kept digest's triggers note the same changes, in the
same order of tables, as the per-blob path: client._vault.kept_digest).

The caller keeps the page's order: a blob that is not fresh flushes the batch before it is
applied on its own, so a later blob never sees an earlier one unwritten.
"""

from __future__ import annotations

import json
import sqlite3
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

from engram_sync.shared_format.plaintext import MemoryPlaintext

from .kept_digest import note_changing
from .store import (
    APPLY_ROW,
    DEFAULT_EMBEDDING_MODEL,
    KnownVersion,
    apply_tombstone,
    row_values,
)

# PRAGMA cache_size during a sync (negative = KiB): a large pull's index inserts (random ids
# and content hashes) and a large push's marks find their pages in memory instead of
# reading and decrypting them again, as an import's (client._vault.transfer
# IMPORT_CACHE_KIB); a sync of a few memories touches a few pages, and the cache only
# holds pages read
SYNC_CACHE_KIB: Final = -131072

# the vault holds nothing of these ids (each appears once in the page: a second version
# of the same memory must meet the first one written)
_FRESH: Final = (
    "SELECT value FROM json_each(?) j"
    " WHERE NOT EXISTS (SELECT 1 FROM engrams WHERE id = j.value)"
    " AND NOT EXISTS (SELECT 1 FROM tombstones WHERE id = j.value)"
    " AND NOT EXISTS (SELECT 1 FROM sync_known_clocks WHERE memory_id = j.value)"
    " AND NOT EXISTS (SELECT 1 FROM sync_local_deletions WHERE memory_id = j.value)"
)
_FIRST_ROWID: Final = "SELECT coalesce(max(rowid), 0) + 1 FROM engrams"
_INSERT_ROW: Final = APPLY_ROW.replace("(layer,", "(rowid, layer,", 1).replace(
    "VALUES (?,", "VALUES (?, ?,", 1
)
_INSERT_FTS: Final = (
    "INSERT INTO engrams_fts (rowid, id, content)"
    " SELECT rowid, id, content FROM engrams WHERE rowid BETWEEN ? AND ? ORDER BY rowid"
)
_ANY_PENDING: Final = "SELECT EXISTS (SELECT 1 FROM sync_pending_links)"
_CLEAR_PENDING: Final = "DELETE FROM sync_pending_links WHERE source_id = ?"
_ADD_PENDING: Final = (
    "INSERT OR REPLACE INTO sync_pending_links (source_id, target_id, link_type, weight)"
    " VALUES (?, ?, ?, ?)"
)
# store._resolve_pending_links for every memory of the batch at once (as source or target)
_RESOLVE: Final = (
    "INSERT OR REPLACE INTO engram_links (source_id, target_id, weight, link_type)"
    " SELECT p.source_id, p.target_id, p.weight, p.link_type FROM sync_pending_links p"
    " WHERE (p.source_id IN (SELECT value FROM json_each(?1))"
    " OR p.target_id IN (SELECT value FROM json_each(?1)))"
    " AND EXISTS (SELECT 1 FROM engrams WHERE id = p.source_id)"
    " AND EXISTS (SELECT 1 FROM engrams WHERE id = p.target_id)"
)
_RESOLVED: Final = (
    "DELETE FROM sync_pending_links WHERE (source_id IN (SELECT value FROM json_each(?1))"
    " OR target_id IN (SELECT value FROM json_each(?1)))"
    " AND EXISTS (SELECT 1 FROM engrams WHERE id = source_id)"
    " AND EXISTS (SELECT 1 FROM engrams WHERE id = target_id)"
)
_EMBEDDING: Final = (
    "INSERT OR REPLACE INTO engram_embeddings (engram_id, embedding, model, dimensions,"
    " created_at) VALUES (?, ?, ?, ?, ?)"
)
_KNOWN: Final = (
    "INSERT OR REPLACE INTO sync_known_clocks (memory_id, vector_clock, device_id, created_at)"
    " VALUES (?, ?, ?, ?)"
)


@contextmanager
def sync_cache(conn: sqlite3.Connection) -> Iterator[None]:
    """A page cache of SYNC_CACHE_KIB for the length of a sync (a larger one is kept), the
    connection's own restored after (its pages freed)."""
    cache = int(conn.execute("PRAGMA cache_size").fetchone()[0])
    conn.execute(f"PRAGMA cache_size = {min(cache, SYNC_CACHE_KIB)}")
    try:
        yield
    finally:
        conn.execute(f"PRAGMA cache_size = {cache}")


def fresh_ids(conn: sqlite3.Connection, memory_ids: Sequence[str]) -> set[str]:
    """The ids of `memory_ids` that appear once and that the vault holds nothing of (no row,
    tombstone, known clock or local deletion): one query for a page."""
    counts: dict[str, int] = {}
    for memory_id in memory_ids:
        counts[memory_id] = counts.get(memory_id, 0) + 1
    once = [memory_id for memory_id, n in counts.items() if n == 1]
    if not once:
        return set()
    return {str(row[0]) for row in conn.execute(_FRESH, (json.dumps(once),))}


def _embedding_values(memory: MemoryPlaintext) -> tuple[Any, ...]:
    values = memory.embedding or []
    return (
        memory.id,
        struct.pack(f"<{len(values)}d", *values),  # VAULT §3: little-endian f64
        memory.embedding_model or DEFAULT_EMBEDDING_MODEL,
        len(values),
        memory.modified_at,
    )


@dataclass
class FreshBatch:
    """Fresh memories (and deletions of fresh ids) waiting to be written, in page order."""

    live: list[MemoryPlaintext] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    known: list[tuple[str, KnownVersion]] = field(default_factory=list)

    def add(self, memory_id: str, live: MemoryPlaintext | None, remote: KnownVersion) -> None:
        """A fresh memory's winning version: `live`, or None for a deletion."""
        if live is None:
            self.deleted.append(memory_id)
        else:
            self.live.append(live)
        self.known.append((memory_id, remote))

    def flush(self, conn: sqlite3.Connection) -> None:
        """Write the batch (in the caller's transaction) and empty it."""
        if not self.known:
            return
        # the kept digest's notes for the batch (no version held: fresh ids)
        note_changing(conn, [memory_id for memory_id, _ in self.known], fresh=True)
        for memory_id in self.deleted:  # rare in bulk: the per-blob statements
            apply_tombstone(conn, memory_id)
        if self.live:
            _write_live(conn, self.live)
        conn.executemany(
            _KNOWN,
            [(m, v.vector_clock, v.device_id, v.created_at) for m, v in self.known],
        )
        self.live, self.deleted, self.known = [], [], []


def _write_live(conn: sqlite3.Connection, memories: list[MemoryPlaintext]) -> None:
    """The rows, full-text rows, waiting links and embeddings of fresh memories
    (store.apply_memory with `new`, for many)."""
    first = int(conn.execute(_FIRST_ROWID).fetchone()[0])
    conn.executemany(_INSERT_ROW, [(first + i, *row_values(m)) for i, m in enumerate(memories)])
    conn.execute(_INSERT_FTS, (first, first + len(memories) - 1))
    pending = bool(conn.execute(_ANY_PENDING).fetchone()[0])
    if pending:  # a row another program removed may have left its waiting links
        conn.executemany(_CLEAR_PENDING, [(m.id,) for m in memories])
    links = [(m.id, k.target_id, k.link_type, k.weight) for m in memories for k in m.links]
    if links:
        conn.executemany(_ADD_PENDING, links)
    if pending or links:
        ids = json.dumps([m.id for m in memories])
        conn.execute(_RESOLVE, (ids,))
        conn.execute(_RESOLVED, (ids,))
    embedded = [_embedding_values(m) for m in memories if m.embedding is not None]
    if embedded:
        conn.executemany(_EMBEDDING, embedded)
