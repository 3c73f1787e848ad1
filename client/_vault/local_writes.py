"""A person's (or a program's) writes to memories on this device, each keeping the version
it replaces in the local history (docs/history.md): the one path the CLI and the Python
API share for edits and deletions."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from .history import DELETE, EDIT, Writer, replacing
from .privacy import set_privacy
from .store import (
    delete_memory,
    edit_memory,
    get_row,
    link_memory,
    set_labels,
    stored_tags,
)


def edit(
    conn: sqlite3.Connection,
    memory_id: str,
    content: str | None,
    privacy_level: str | None,
    by: Writer,
    *,
    own_device: str,
    tags: Sequence[str] | None = None,
    project: str | None = None,
    layer: str | None = None,
) -> str | None:
    """Replace a memory's content, privacy level, tags, project or layer (those given) as
    one new version; returns the level it had, None when there is no such memory."""
    row = get_row(conn, memory_id)
    if row is None:
        return None
    previous: str = row["privacy_level"]
    labels_change = _labels_change(row, tags, project, layer)
    if content is None and privacy_level in (None, previous) and not labels_change:
        return previous  # nothing changes: no new version
    with replacing(conn, memory_id, EDIT, by, own_device=own_device):
        if privacy_level is not None:
            set_privacy(conn, memory_id, privacy_level)
        if content is not None:
            edit_memory(conn, memory_id, content)
        if labels_change:
            set_labels(conn, memory_id, tags=tags, project=project, layer=layer)
    return previous


def _labels_change(
    row: sqlite3.Row, tags: Sequence[str] | None, project: str | None, layer: str | None
) -> bool:
    """Whether the tags, project or layer given differ from the row's."""
    return (
        (tags is not None and stored_tags(row) != list(tags))
        or (project is not None and row["project"] != project)
        or (layer is not None and row["layer"] != layer)
    )


def delete(conn: sqlite3.Connection, memory_id: str, by: Writer, *, own_device: str) -> bool:
    """Delete a memory (its last version is kept); False when there is no such memory."""
    if get_row(conn, memory_id) is None:
        return False
    with replacing(conn, memory_id, DELETE, by, own_device=own_device, deletion=True):
        delete_memory(conn, memory_id)
    return True


def link(
    conn: sqlite3.Connection,
    source_id: str,
    target_id: str,
    link_type: str,
    weight: float,
    by: Writer,
    *,
    own_device: str,
) -> bool:
    """Link `source_id` to `target_id` as a new version of the source memory (the version it
    replaces is kept); False when either memory is missing."""
    if get_row(conn, source_id) is None or get_row(conn, target_id) is None:
        return False
    with replacing(conn, source_id, EDIT, by, own_device=own_device):
        link_memory(conn, source_id, target_id, link_type, weight)
    return True
