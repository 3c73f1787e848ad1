"""What `list` and `search` print (client._render, issue 36) on a real SQLCipher vault: the
summaries read straight from the rows equal those built from each memory's plaintext (as
before), and the JSON is the bytes rich printed to a file, written without rich."""

from __future__ import annotations

import io
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_sync.client._render import console, list_items, print_json, search_items
from engram_sync.client._vault import store
from engram_sync.client._vault.schema import migrate
from engram_sync.shared_format.plaintext import MemoryPlaintext
from engram_sync.shared_format.vault import open_vault


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    vault = open_vault(tmp_path / "vault", "render tests", create=True)
    migrate(vault.conn)
    try:
        yield vault.conn
    finally:
        vault.close()


def _from_plaintext(conn: sqlite3.Connection, memory: MemoryPlaintext) -> dict[str, Any]:
    """The summary as it was built before issue 36: from the plaintext and the row."""
    row = store.get_row(conn, memory.id)
    return {
        "id": memory.id, "content": memory.content, "layer": memory.layer,
        "tags": memory.tags, "project": memory.project, "created_at": memory.created_at,
        "modified_at": memory.modified_at, "privacy_level": memory.privacy_level,
        "synced": row is not None and not store.row_needs_push(row),
    }  # fmt: skip


def test_summaries_read_from_rows_equal_the_plaintexts(conn: sqlite3.Connection) -> None:
    ids = [store.add_memory(conn, f"note {i} ünïcode \u2028", tags=["a", "b"]) for i in range(6)]
    store.add_memory(conn, "private words", privacy_level="strict_local", project="p")
    row = store.get_row(conn, ids[0])
    assert row is not None
    store.mark_pushed(conn, ids[0], row["modified_at"])
    store.mark_pushed(conn, ids[1], "1999-01-01T00:00:00+00:00")  # edited since its push
    hand = (  # rows as another tool may write them
        ("UPDATE engrams SET tags = '[1, \"x\", null]' WHERE id = ?", ids[2]),
        ('UPDATE engrams SET tags = \'{"not": "a list"}\' WHERE id = ?', ids[3]),
        ("UPDATE engrams SET tags = 'not json' WHERE id = ?", ids[4]),
        ("UPDATE engrams SET modified_at = NULL, synced_at = created_at WHERE id = ?", ids[5]),
    )
    for sql, memory_id in hand:
        conn.execute(sql, (memory_id,))
    expected = [_from_plaintext(conn, m) for m in store.list_memories(conn)]
    assert list_items(conn) == expected
    assert [item["synced"] for item in expected[:2]] == [True, False]
    assert expected[2]["tags"] == ["1", "x", "None"]
    mode, found = search_items(conn, "note", [], None, None, 4)
    assert mode == "all"
    assert len(found) == 4
    by_id = {e["id"]: e for e in expected}
    assert found == [by_id[f["id"]] for f in found]
    assert search_items(conn, "private", [], "p", None, 20)[1] == [expected[-1]]


@pytest.mark.parametrize(
    "payload",
    [
        [],
        {"mode": "any", "results": []},
        [{"b": 1, "a": None, "c": [], "d": 'é\u2028\x7f\x00\x1f\t\n\r"\\/ 😀', "e": True}],
    ],
)
def test_json_is_the_bytes_rich_printed(payload: object) -> None:
    written, rendered = io.StringIO(), io.StringIO()
    print_json(payload, console(file=written))
    console(file=rendered).print_json(json.dumps(payload, ensure_ascii=False, sort_keys=True))
    assert written.getvalue() == rendered.getvalue()
