"""The local store on a real SQLCipher vault: edits, push bookkeeping, LWW, applying."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from engram_sync.client._vault import store as ls
from engram_sync.client._vault.schema import migrate
from engram_sync.shared_format.plaintext import Link, MemoryPlaintext
from engram_sync.shared_format.timestamps import parse_rfc3339
from engram_sync.shared_format.vault import open_vault


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "vault"
    open_vault(path, "local store tests", create=True).close()
    return path


@pytest.fixture
def conn(template: Path, tmp_path: Path) -> Iterator[sqlite3.Connection]:
    path = tmp_path / "vault"
    shutil.copytree(template, path)
    vault = open_vault(path, "local store tests")
    migrate(vault.conn)
    try:
        yield vault.conn
    finally:
        vault.close()


def _remote(memory_id: str, content: str, **changes: object) -> MemoryPlaintext:
    base = MemoryPlaintext(
        id=memory_id, content=content, layer="semantic", scope="rule", content_type="text",
        source="agent", privacy_level="hybrid", context={"k": [1]},
        created_at="2026-01-01T00:00:00.000000+00:00",
        modified_at="2026-01-02T00:00:00.000000+00:00", last_retrieved=None, occurred_at=None,
        project="p", tags=["t"], strength=1.0, valence=0.0, retrievals=0, imagined=False,
        grounded=False, links=[], embedding=None, embedding_model=None,
    )  # fmt: skip
    return msgspec.structs.replace(base, **changes)


def test_add_edit_delete_and_push_bookkeeping(conn: sqlite3.Connection) -> None:
    memory_id = ls.add_memory(conn, "[12] first  Note", tags=["a"])
    assert memory_id.startswith("mem_")
    assert len(memory_id) == 20
    assert ls.count_to_push(conn) == (1, 0)
    row = ls.get_row(conn, memory_id)
    assert row is not None
    ls.mark_pushed(conn, memory_id, row["modified_at"])
    assert ls.count_to_push(conn) == (0, 0)
    assert ls.edit_memory(conn, memory_id, "second")
    assert ls.count_to_push(conn) == (1, 0)
    hits = conn.execute("SELECT id FROM engrams_fts WHERE engrams_fts MATCH 'second'").fetchall()
    assert [h[0] for h in hits] == [memory_id]
    assert ls.delete_memory(conn, memory_id)
    assert ls.count_to_push(conn) == (0, 1)
    assert ls.get_row(conn, memory_id) is None
    assert not ls.edit_memory(conn, memory_id, "gone")
    assert conn.execute("SELECT count(*) FROM engrams_fts").fetchone()[0] == 0


def test_content_hash_is_normalised(conn: sqlite3.Connection) -> None:
    from engram_sync.shared_format.vault import normalized_hash

    memory_id = ls.add_memory(conn, "[89] [10:23:45] [/home/alice/engram] Cargo  check")
    row = conn.execute("SELECT content_hash FROM engrams WHERE id = ?", (memory_id,)).fetchone()
    assert row[0] == normalized_hash("cargo check")


def test_edit_after_a_remote_row_from_the_future_still_needs_push(conn: sqlite3.Connection) -> None:
    future = "2999-01-01T00:00:00Z"  # another device's clock ran far ahead, and says Z
    ls.apply_memory(conn, _remote("mem_future", "remote", modified_at=future))
    assert ls.count_to_push(conn) == (0, 0)  # applied as received, synced_at = modified_at
    assert ls.edit_memory(conn, "mem_future", "local edit")
    row = ls.get_row(conn, "mem_future")
    assert row is not None
    assert parse_rfc3339(row["modified_at"]) > parse_rfc3339(future)
    assert ls.row_needs_push(row)
    assert ls.count_to_push(conn) == (1, 0)


def test_push_keys_list_rows_needing_a_push_oldest_edit_first(conn: sqlite3.Connection) -> None:
    early, late = "2030-01-01T00:00:00.000000+00:00", "2030-01-02T00:00:00.000000+00:00"
    a, b, c, d = (ls.add_memory(conn, text) for text in "abcd")
    for memory_id, stamp in ((a, late), (b, early), (c, late), (d, early)):
        conn.execute("UPDATE engrams SET modified_at = ? WHERE id = ?", (stamp, memory_id))
    ls.mark_pushed(conn, d, early)
    keys = ls.push_keys(conn)
    assert keys == [(early, b), *sorted([(late, a), (late, c)])]  # PROTOCOL §8, ties by id
    assert ls.push_keys(conn, after=keys[0]) == keys[1:]
    assert ls.push_keys(conn, after=keys[1]) == keys[2:]
    assert ls.push_keys(conn, after=keys[2]) == []
    assert ls.push_keys(conn, after=(early, "")) == keys


def test_push_keys_read_the_index_of_rows_to_push(conn: sqlite3.Connection) -> None:
    """Issue 36: the rows to push come from the partial index `sync_push_pending`, not a
    scan of engrams; the index holds exactly the rows needing a push, whoever wrote them."""
    ids = [ls.add_memory(conn, f"row {i}") for i in range(300)]
    for memory_id in ids[:290]:
        row = ls.get_row(conn, memory_id)
        assert row is not None
        ls.mark_pushed(conn, memory_id, row["modified_at"])
    ls.edit_memory(conn, ids[3], "edited")
    conn.execute("UPDATE engrams SET privacy_level = 'strict_local' WHERE id = ?", (ids[299],))
    conn.execute(  # a hand edit (an Engram tool): the index follows it too
        "UPDATE engrams SET modified_at = '2099-01-01T00:00:00.000000+00:00' WHERE id = ?",
        (ids[5],),
    )
    for after in (False, True):
        plan = conn.execute(
            "EXPLAIN QUERY PLAN " + ls.push_keys_query(after=after), ("", "", "") if after else ()
        ).fetchall()
        assert [str(step[3]) for step in plan] == ["SCAN engrams USING INDEX sync_push_pending"]
    full_scan = ls.push_keys_query(after=False).replace("FROM engrams", "FROM engrams NOT INDEXED")
    keys = ls.push_keys(conn)
    assert keys == [(str(k), str(i)) for k, i in conn.execute(full_scan)]
    assert [memory_id for _, memory_id in keys] == [*ids[290:299], ids[3], ids[5]]
    assert conn.execute("SELECT count(*) FROM engrams INDEXED BY sync_push_pending"
                        f" WHERE {ls.NEEDS_PUSH}").fetchone()[0] == 11  # fmt: skip


def test_rows_needing_push_come_in_the_order_asked(conn: sqlite3.Connection) -> None:
    ids = [ls.add_memory(conn, f"row {i}") for i in range(1200)]  # more than one IN (...)
    pushed = ls.get_row(conn, ids[7])
    assert pushed is not None
    ls.mark_pushed(conn, ids[7], pushed["modified_at"])
    ls.delete_memory(conn, ids[8])
    asked = [*reversed(ids), "mem_missing"]
    rows = ls.rows_needing_push(conn, asked)
    assert [r["id"] for r in rows] == [i for i in reversed(ids) if i not in (ids[7], ids[8])]
    assert rows[0]["content"] == "row 1199"
    assert ls.rows_needing_push(conn, []) == []


def test_apply_writes_as_received(conn: sqlite3.Connection) -> None:
    remote = _remote("mem_r", "remote text", embedding=[0.5, 1.5], embedding_model="m")
    ls.apply_memory(conn, remote)
    assert ls.get_memory(conn, "mem_r") == remote
    row = ls.get_row(conn, "mem_r")
    assert row is not None
    assert row["synced_at"] == row["modified_at"] == remote.modified_at


def test_links_wait_for_their_target(conn: sqlite3.Connection) -> None:
    link = Link(link_type="temporal", target_id="mem_later", weight=0.3)
    ls.apply_memory(conn, _remote("mem_first", "first", links=[link]))
    assert conn.execute("SELECT count(*) FROM engram_links").fetchone()[0] == 0
    ls.apply_memory(conn, _remote("mem_later", "arrives later"))
    first = ls.get_memory(conn, "mem_first")
    assert first is not None
    assert first.links == [link]
    assert conn.execute("SELECT count(*) FROM sync_pending_links").fetchone()[0] == 0


def test_remote_tombstone_leaves_no_local_tombstone(conn: sqlite3.Connection) -> None:
    ls.apply_memory(conn, _remote("mem_x", "x"))
    ls.apply_tombstone(conn, "mem_x")
    assert ls.get_row(conn, "mem_x") is None
    assert ls.count_to_push(conn) == (0, 0)


@pytest.mark.parametrize(
    ("remote", "known", "wins"),
    [
        (ls.KnownVersion(5, "b", "2026-01-01T00:00:00+00:00"), None, True),
        (ls.KnownVersion(6, "b", "2026-01-01T00:00:00+00:00"),
         ls.KnownVersion(5, "a", "2026-01-02T00:00:00+00:00"), True),
        (ls.KnownVersion(4, "b", "2026-01-03T00:00:00+00:00"),
         ls.KnownVersion(5, "a", "2026-01-01T00:00:00+00:00"), False),
        (ls.KnownVersion(5, "a", "2026-01-03T00:00:00+00:00"),
         ls.KnownVersion(5, "a", "2026-01-01T00:00:00+00:00"), False),  # same version
        # equal clocks from different devices (legacy): the later instant wins ...
        (ls.KnownVersion(5, "a", "2026-01-01T02:00:00+02:00"),
         ls.KnownVersion(5, "b", "2026-01-01T00:30:00+00:00"), False),
        (ls.KnownVersion(5, "a", "2026-01-01T01:00:00Z"),
         ls.KnownVersion(5, "b", "2026-01-01T00:30:00+00:00"), True),
        # ... then the higher device id
        (ls.KnownVersion(5, "b", "2026-01-01T00:00:00Z"),
         ls.KnownVersion(5, "a", "2026-01-01T00:00:00+00:00"), True),
        (ls.KnownVersion(5, "a", "2026-01-01T00:00:00Z"),
         ls.KnownVersion(5, "b", "2026-01-01T00:00:00+00:00"), False),
    ],
)  # fmt: skip
def test_lww(remote: ls.KnownVersion, known: ls.KnownVersion | None, wins: bool) -> None:
    assert ls.remote_wins(remote, known) is wins


def test_local_state(conn: sqlite3.Connection) -> None:
    assert ls.local_state(conn, "mem_never_seen") == ls.LocalState(exists=False, unpushed=None)
    memory_id = ls.add_memory(conn, "unpushed")
    local = ls.local_state(conn, memory_id)
    assert local.exists
    assert local.unpushed is not None
    assert '"content":"unpushed"' in local.unpushed[0]
    row = ls.get_row(conn, memory_id)
    assert row is not None
    ls.mark_pushed(conn, memory_id, row["modified_at"])
    assert ls.local_state(conn, memory_id) == ls.LocalState(exists=True, unpushed=None)
    ls.delete_memory(conn, memory_id)
    tomb = ls.local_state(conn, memory_id)
    assert tomb.exists
    assert tomb.unpushed is not None
    assert tomb.unpushed[0] == f'{{"deleted":true,"id":"{memory_id}"}}'


def _vault_rows(conn: sqlite3.Connection) -> dict[str, list[tuple[object, ...]]]:
    tables = {
        "engrams": "SELECT id, content, synced_at FROM engrams",
        "engrams_fts": "SELECT rowid, id, content FROM engrams_fts",
        "engram_links": "SELECT source_id, target_id, link_type, weight FROM engram_links",
        "sync_pending_links": "SELECT source_id, target_id FROM sync_pending_links",
        "engram_embeddings": "SELECT engram_id, model, dimensions FROM engram_embeddings",
        "tombstones": "SELECT id FROM tombstones",
    }
    return {name: sorted(map(tuple, conn.execute(sql))) for name, sql in tables.items()}


def test_applying_a_new_memory_skips_only_deletes_that_find_nothing(
    template: Path, tmp_path: Path
) -> None:
    """`new=True` (what the syncer passes when `local_state` finds nothing) must leave the
    vault exactly as the full replace does: searchable, linked, embedded."""
    target = Link(link_type="causal", target_id="mem_target", weight=0.7)
    later = Link(link_type="temporal", target_id="mem_not_yet", weight=0.2)
    memories = [
        _remote("mem_target", "the target"),
        _remote(
            "mem_new",
            "brand new words",
            links=[target, later],
            embedding=[0.25, 0.5],
            embedding_model="m",
        ),
        _remote("mem_plain", "no links, no embedding"),
    ]
    states = []
    for new in (False, True):
        path = tmp_path / f"new-{new}"
        shutil.copytree(template, path)
        vault = open_vault(path, "local store tests")
        try:
            db = vault.conn
            migrate(db)
            for memory in memories:
                assert not ls.local_state(db, memory.id).exists
                ls.apply_memory(db, memory, new=new)
            hits = db.execute("SELECT id FROM engrams_fts WHERE engrams_fts MATCH 'brand'")
            assert [h[0] for h in hits] == ["mem_new"]
            # the link to a memory not pulled yet waits (sync_pending_links)
            stored = msgspec.structs.replace(memories[1], links=[target])
            assert ls.get_memory(db, "mem_new") == stored
            states.append(_vault_rows(db))
        finally:
            vault.close()
    assert states[0] == states[1]
    assert states[0]["engram_links"] == [("mem_new", "mem_target", "causal", 0.7)]
    assert states[0]["sync_pending_links"] == [("mem_new", "mem_not_yet")]


@pytest.mark.parametrize(
    "memory_id", ["mem_1a2b3c4d-5e6f-4a", 'eng_"quoted" id', "___", "mém-ünï", "a"]
)
def test_fts_rows_follow_their_memory(conn: sqlite3.Connection, memory_id: str) -> None:
    ls.apply_memory(conn, _remote("mem_other", "unrelated words stay"))
    ls.apply_memory(conn, _remote(memory_id, "first words"))
    ls.apply_memory(conn, _remote(memory_id, "second words"))
    rows = conn.execute("SELECT id, content FROM engrams_fts ORDER BY id").fetchall()
    assert sorted((r[0], r[1]) for r in rows) == sorted(
        [("mem_other", "unrelated words stay"), (memory_id, "second words")]
    )
    ls.apply_tombstone(conn, memory_id)
    rows = conn.execute("SELECT id FROM engrams_fts").fetchall()
    assert [r[0] for r in rows] == ["mem_other"]
    hits = conn.execute("SELECT id FROM engrams_fts WHERE engrams_fts MATCH 'unrelated'")
    assert [h[0] for h in hits] == ["mem_other"]
