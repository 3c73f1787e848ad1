"""Full-text search of the local vault (VAULT §3 `engrams_fts`), for `engram-sync search`
and `Vault.search` alike (docs/search.md).

The reference's semantics: the query's words must all appear (AND); when no memory has
them all, any of them will do (OR); when the index cannot answer (it refuses the query or
is damaged), or the query has no word the index knows (only punctuation), a plain
case-insensitive substring search of the content answers instead. Each word is matched as
a quoted phrase, so FTS5 syntax in a query (`AND`, `*`, `:`, parentheses) is plain text.

Results are in one stated total order: best bm25 rank first (FTS5's `rank`; the substring
search has none), then the most recently modified, then by id.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from engram_sync.shared_format.plaintext import MemoryPlaintext
from engram_sync.shared_format.vault import OperationalError

from .store import get_memory

SearchMode = Literal["all", "any", "substring"]
DEFAULT_LIMIT: Final = 20
_MAX_WINDOW: Final = 400  # matches read from the index alone before the whole join answers
_ORDER: Final = "coalesce(e.modified_at, e.created_at) DESC, e.id"


@dataclass(frozen=True)
class SearchFilters:
    """Narrowing filters: every tag given, the project, the layer (None: any)."""

    tags: Sequence[str] = ()
    project: str | None = None
    layer: str | None = None

    def sql(self) -> tuple[str, list[Any]]:
        """A WHERE fragment over `engrams e` (starting with AND) and its parameters."""
        parts: list[str] = []
        params: list[Any] = []
        for tag in self.tags:
            # tags is a JSON array string (VAULT §3); a malformed one matches no tag
            parts.append(
                "CASE WHEN json_valid(e.tags) THEN EXISTS"
                " (SELECT 1 FROM json_each(e.tags) WHERE json_each.value = ?) ELSE 0 END"
            )
            params.append(tag)
        if self.project is not None:
            parts.append("e.project = ?")
            params.append(self.project)
        if self.layer is not None:
            parts.append("e.layer = ?")
            params.append(self.layer)
        return "".join(" AND " + part for part in parts), params


@dataclass(frozen=True)
class SearchResult:
    """The memories found, best first, and which of the three searches found them."""

    mode: SearchMode
    memories: list[MemoryPlaintext] = field(default_factory=list)


def _words(query: str) -> list[str]:
    """The query's words the index can match (a word of punctuation only has no token)."""
    return [word for word in query.split() if any(ch.isalnum() for ch in word)]


def _phrase(word: str) -> str:
    return '"' + word.replace('"', '""') + '"'


def _fts_ids(conn: sqlite3.Connection, match: str, filters: SearchFilters, limit: int) -> list[str]:
    """The ids of the best `limit` matches passing `filters`, in the stated order. The
    best-ranked matches come from the index alone (FTS5 keeps its top rows by rank without
    sorting them all), in growing windows; only they are joined with `engrams` for the
    filters and the order's tie-breaks. The whole ordered join answers when a window of
    `_MAX_WINDOW` matches is not enough (selective filters, a long run of equal ranks)."""
    window = limit
    while window <= _MAX_WINDOW:
        rows = conn.execute(
            "SELECT id, rank FROM engrams_fts WHERE engrams_fts MATCH ? ORDER BY rank LIMIT ?",
            (match, window + 1),
        ).fetchall()
        complete = len(rows) <= window  # every match is here
        if not complete:
            # a match beyond the window ranks at least as the first one left out: the
            # matches ranked strictly better are all here, and they come first
            cutoff = rows[window][1]
            rows = [row for row in rows[:window] if row[1] < cutoff]
        ids = _ordered_ids(conn, rows, filters, limit)
        if complete or len(ids) == limit:
            return ids
        window *= 4
    where, params = filters.sql()
    found = conn.execute(
        "SELECT e.id FROM engrams_fts f JOIN engrams e ON e.id = f.id"  # noqa: S608 - constants
        f" WHERE engrams_fts MATCH ?{where} ORDER BY f.rank, {_ORDER} LIMIT ?",
        (match, *params, limit),
    ).fetchall()
    return [str(row[0]) for row in found]


def _ordered_ids(
    conn: sqlite3.Connection, ranked: Sequence[Any], filters: SearchFilters, limit: int
) -> list[str]:
    """The best `limit` of the (id, rank) matches `ranked` that pass `filters`, in the
    stated order (the same ORDER BY as the whole join)."""
    if not ranked:
        return []
    where, params = filters.sql()
    values = ", ".join("(?, ?)" for _ in ranked)
    found = conn.execute(
        f"WITH m(id, rank) AS (VALUES {values})"  # noqa: S608 - placeholders only
        f" SELECT e.id FROM m JOIN engrams e ON e.id = m.id WHERE 1{where}"
        f" ORDER BY m.rank, {_ORDER} LIMIT ?",
        (*(value for row in ranked for value in row), *params, limit),
    ).fetchall()
    return [str(row[0]) for row in found]


def _substring_ids(
    conn: sqlite3.Connection, needle: str, filters: SearchFilters, limit: int
) -> list[str]:
    where, params = filters.sql()
    rows = conn.execute(
        "SELECT e.id FROM engrams e WHERE instr(lower(e.content), lower(?)) > 0"  # noqa: S608
        f"{where} ORDER BY {_ORDER} LIMIT ?",
        (needle, *params, limit),
    ).fetchall()
    return [str(row[0]) for row in rows]


def search_ids(
    conn: sqlite3.Connection,
    query: str,
    *,
    limit: int = DEFAULT_LIMIT,
    filters: SearchFilters | None = None,
) -> tuple[SearchMode, list[str]]:
    """The search's mode and the ids it finds, best first (module docstring)."""
    chosen = filters or SearchFilters()
    needle = query.strip()
    if not needle or limit <= 0:
        return "all", []
    words = _words(needle)
    mode: SearchMode = "substring"
    ids: list[str] = []
    if words:
        try:
            mode = "all"
            ids = _fts_ids(conn, "content:(" + " ".join(map(_phrase, words)) + ")", chosen, limit)
            if not ids and len(words) > 1:
                mode = "any"
                ids = _fts_ids(
                    conn, "content:(" + " OR ".join(map(_phrase, words)) + ")", chosen, limit
                )
        except OperationalError:  # the index refused the query or is damaged
            mode, ids = "substring", []
    if mode == "substring":
        ids = _substring_ids(conn, needle, chosen, limit)
    return mode, ids


def search(
    conn: sqlite3.Connection,
    query: str,
    *,
    limit: int = DEFAULT_LIMIT,
    filters: SearchFilters | None = None,
) -> SearchResult:
    """Search the vault (module docstring); an empty query finds nothing."""
    mode, ids = search_ids(conn, query, limit=limit, filters=filters)
    found = (get_memory(conn, memory_id) for memory_id in ids)
    return SearchResult(mode, [memory for memory in found if memory is not None])


def search_memories(
    conn: sqlite3.Connection,
    query: str,
    limit: int = DEFAULT_LIMIT,
    filters: SearchFilters | None = None,
) -> list[MemoryPlaintext]:
    """The memories `search` finds, best first."""
    return search(conn, query, limit=limit, filters=filters).memories
