"""A pulled page applied in bulk (client._vault.fresh_apply) leaves exactly what applying it
one memory at a time leaves (issue 36), on real SQLCipher vaults through a real relay.

Device A writes memories with links (some to memories of later pages, one to a memory B
keeps local), embeddings, deletions and edits; device B pulls them in small pages, mixing
memories it holds nothing of (the bulk path) with ones it holds (the per-blob path: LWW,
a conflict with its own unpushed edit, history). Device C pulls the same with the bulk path
switched off. Every table a pull writes must be the same on B and C, row for row.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_sync.client._session import VaultSession
from engram_sync.client._sync import engine
from engram_sync.client._sync.reports import SyncReport
from engram_sync.client._vault import store as local_store
from tests.relay.conftest import ADMIN_KEY, Relay

PASSPHRASE = "bulk apply tests: correct horse battery staple"
VAULT_ID = "vault-bulk-apply"

# what a pull writes, each read in an order of its own (rowids may differ: compared apart)
_TABLES = {
    "engrams": "SELECT id, layer, source, privacy_level, content, context, strength, valence,"
    " retrievals, imagined, grounded, created_at, last_retrieved, project, tags, content_hash,"
    " scope, content_type, occurred_at, modified_at, synced_at FROM engrams ORDER BY id",
    "fts": "SELECT f.id, f.content, f.rowid = e.rowid FROM engrams_fts f"
    " LEFT JOIN engrams e ON e.id = f.id ORDER BY f.id",
    "fts_match": "SELECT id FROM engrams_fts WHERE engrams_fts MATCH 'linked' ORDER BY id",
    "links": "SELECT source_id, target_id, weight, link_type FROM engram_links ORDER BY 1, 2",
    "pending": "SELECT * FROM sync_pending_links ORDER BY 1, 2",
    "embeddings": "SELECT engram_id, embedding, model, dimensions, created_at"
    " FROM engram_embeddings ORDER BY 1",
    "known": "SELECT * FROM sync_known_clocks ORDER BY 1",
    "tombstones": "SELECT * FROM tombstones ORDER BY 1",
    "conflicts": "SELECT memory_id, remote_device_id, remote_vector_clock, remote_deleted,"
    " json_extract(local_plaintext, '$.content') FROM sync_conflicts ORDER BY 1, 3",
    "history": "SELECT memory_id, version, deleted, content, reason FROM sync_history ORDER BY seq",
    "digest": "SELECT digest, count FROM sync_digest",
    "dirty": "SELECT * FROM sync_digest_dirty",
}


def _dump(conn: sqlite3.Connection) -> dict[str, list[tuple[object, ...]]]:
    return {name: [tuple(row) for row in conn.execute(sql)] for name, sql in _TABLES.items()}


@pytest.fixture
def devices(tmp_path: Path, relay: Relay) -> Iterator[dict[str, VaultSession]]:
    opened: dict[str, VaultSession] = {}
    try:
        for name in ("alpha", "bravo", "charlie"):
            session = VaultSession.open(tmp_path / name, PASSPHRASE, create=True)
            opened[name] = session
            session.link(relay.url, ADMIN_KEY, VAULT_ID, name)
        yield opened
    finally:
        for session in opened.values():
            session.close()


def _sync(session: VaultSession) -> None:
    with session.relay() as relay:
        session.syncer(relay).sync()


def _pull(session: VaultSession) -> None:
    """Pages of 7 blobs; only a pull (B's and C's own edits stay theirs, unpushed)."""
    with session.relay() as relay:
        session.syncer(relay, pull_page=7).pull(SyncReport())


def _embed(conn: sqlite3.Connection, memory_id: str, values: list[float]) -> None:
    conn.execute(
        "INSERT INTO engram_embeddings (engram_id, embedding, model, dimensions, created_at)"
        " VALUES (?, ?, 'test-model', ?, '2026-01-01T00:00:00Z')",
        (memory_id, local_store._embedding_blob(values), len(values)),
    )
    local_store.mark_edited(conn, memory_id, local_store.next_modified_at())


def _first_round(alpha: VaultSession) -> list[str]:
    """Memories with links to later ones (their targets arrive pages later), embeddings,
    a deleted one."""
    with alpha.vault.transaction() as conn:
        ids = [local_store.add_memory(conn, f"linked memory {i}") for i in range(30)]
        for i in range(0, 29, 3):  # each to a memory added after it
            local_store.link_memory(conn, ids[i], ids[min(29, i + 1 + (i % 5))], "associative", 0.5)
        local_store.link_memory(conn, ids[29], ids[0], "causal", 0.25)
        for i in (2, 9, 17):
            _embed(conn, ids[i], [0.5, -1.0, float(i)])
        local_store.delete_memory(conn, ids[4])  # a deletion B never saw a version of
    return ids


def _second_round(alpha: VaultSession, ids: list[str]) -> None:
    """Edits and deletions of memories B now holds, between new ones linked to them."""
    with alpha.vault.transaction() as conn:
        for i in (1, 6, 12):
            local_store.edit_memory(conn, ids[i], f"linked memory {i}, edited")
        local_store.delete_memory(conn, ids[7])  # the target of ids[3]'s link
        for i in range(10):
            new = local_store.add_memory(conn, f"linked memory new {i}")
            local_store.link_memory(conn, new, ids[(i * 3) % 30], "temporal", 0.75)


def _local_change(device: VaultSession, ids: list[str]) -> None:
    """An unpushed edit that loses to A's: a conflict."""
    with device.vault.transaction() as conn:
        local_store.edit_memory(conn, ids[12], "linked memory 12, edited here")


def test_a_bulk_applied_pull_leaves_what_a_blob_by_blob_pull_leaves(
    devices: dict[str, VaultSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    alpha, bravo, charlie = devices["alpha"], devices["bravo"], devices["charlie"]
    ids = _first_round(alpha)
    _sync(alpha)

    def one_by_one() -> None:
        with monkeypatch.context() as patched:  # the bulk path off: every memory alone
            patched.setattr(engine, "fresh_ids", lambda conn, memory_ids: set())
            _pull(charlie)

    _pull(bravo)
    one_by_one()
    assert _dump(bravo.vault.conn) == _dump(charlie.vault.conn)
    assert _dump(bravo.vault.conn)["links"]

    _second_round(alpha, ids)
    _sync(alpha)
    _local_change(bravo, ids)
    _local_change(charlie, ids)
    _pull(bravo)
    one_by_one()
    b, c = _dump(bravo.vault.conn), _dump(charlie.vault.conn)
    for table in _TABLES:
        assert b[table] == c[table], table
    assert b["conflicts"]
    assert b["history"]
    assert b["embeddings"]
    assert all(row[2] == 1 for row in b["fts"])  # each full-text row on its memory's rowid
    assert len(b["fts_match"]) == len(b["engrams"])
