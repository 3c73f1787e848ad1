"""What `list` and `search` show of a memory, read straight from its engrams row (issue 36):
one query for the whole vault or per 500 ids, no plaintext, links or embedding built."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Final

from .store import json_or

_COLUMNS: Final = (
    "id, content, layer, tags, project, created_at, modified_at, privacy_level, synced_at"
)
_IDS_PER_QUERY: Final = 500  # under SQLite's historical limit of 999 parameters


def summary(row: Sequence[Any]) -> dict[str, Any]:
    """The summary of one row of `_COLUMNS`: the fields of `list --json`, as the memory's
    plaintext gives them (client._vault.store.plaintext_from: modified_at falls back to
    created_at, tags a list of strings), and `synced`: no push pending (PROTOCOL §8,
    store.row_needs_push)."""
    memory_id, content, layer, tags, project, created_at, modified_at, privacy, synced_at = row
    decoded = json_or(tags, [])
    return {
        "id": memory_id,
        "content": content,
        "layer": layer,
        "tags": [str(t) for t in decoded] if isinstance(decoded, list) else [],
        "project": project,
        "created_at": created_at,
        "modified_at": modified_at or created_at,
        "privacy_level": privacy,  # docs/privacy.md
        "synced": synced_at is not None and not (modified_at or "") > synced_at,
    }


def all_summaries(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every memory's summary, oldest first (as store.list_memories orders them)."""
    query = f"SELECT {_COLUMNS} FROM engrams ORDER BY created_at, id"  # noqa: S608 - constants
    return [summary(row) for row in conn.execute(query)]


def summaries_of(conn: sqlite3.Connection, ids: Sequence[str]) -> list[dict[str, Any]]:
    """The summaries of `ids` in that order; ids with no row are left out."""
    found: dict[str, dict[str, Any]] = {}
    for start in range(0, len(ids), _IDS_PER_QUERY):
        chunk = list(ids[start : start + _IDS_PER_QUERY])
        marks = ", ".join("?" * len(chunk))
        query = f"SELECT {_COLUMNS} FROM engrams WHERE id IN ({marks})"  # noqa: S608
        for row in conn.execute(query, chunk):
            found[row[0]] = summary(row)
    return [found[memory_id] for memory_id in ids if memory_id in found]
