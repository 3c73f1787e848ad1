"""The client's own tables (client._vault.schema) on real SQLCipher vaults: created and
versioned when a session opens a vault, old vaults upgraded with their rows, newer ones
refused untouched, and the Engram schema (VAULT §3, user_version 10) left as it is."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlcipher3

from engram_sync.client._session import VaultSession
from engram_sync.client._vault import schema as local_schema
from engram_sync.client._vault.schema import (
    SCHEMA_VERSION,
    LocalSchemaTooNewError,
    migrate,
    schema_version,
)
from engram_sync.shared_format.vault import open_vault
from engram_sync.shared_format.vault.schema import SCHEMA_VERSION as ENGRAM_SCHEMA_VERSION

PASSPHRASE = "local schema tests"
EXE = str(Path(sys.executable).parent / "engram-sync")
SYNC_TABLES = {
    "sync_known_clocks",
    "sync_pending_links",
    "sync_vault_key",
    "sync_vault_key_expected",
    "sync_handoff_request",
    "sync_handoff_pake",
    "sync_pairing_code",
    "sync_digest_compacted",  # migration 2 (PROTOCOL §18)
    "sync_digest",  # migration 5 (issue 36): the kept digest
    "sync_digest_dirty",
}
# migration 5 (issue 36), ours on the Engram tables: the triggers that note a memory's held
# version before it changes (client._vault.kept_digest) and the index of rows to push
OURS_ON_ENGRAM_TABLES = {
    ("index", "sync_push_pending", "engrams"),
    ("trigger", "sync_digest_note_engrams_insert", "engrams"),
    ("trigger", "sync_digest_note_engrams_delete", "engrams"),
    ("trigger", "sync_digest_note_tombstones_insert", "tombstones"),
    ("trigger", "sync_digest_note_tombstones_delete", "tombstones"),
}

# The tables exactly as client._vault.store and client._vault.vault_key_store created them before
# client._vault.schema existed (no sync_schema table): what an existing vault holds.
OLD_SQL = """
CREATE TABLE IF NOT EXISTS sync_known_clocks (
    memory_id TEXT PRIMARY KEY, vector_clock INTEGER NOT NULL,
    device_id TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sync_pending_links (
    source_id TEXT NOT NULL, target_id TEXT NOT NULL, link_type TEXT NOT NULL,
    weight REAL NOT NULL, PRIMARY KEY (source_id, target_id));
CREATE TABLE IF NOT EXISTS sync_vault_key (
    vault_id TEXT PRIMARY KEY, k BLOB NOT NULL, source TEXT NOT NULL, stored_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sync_vault_key_expected (
    vault_id TEXT PRIMARY KEY, source TEXT NOT NULL, since TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sync_handoff_request (
    request_id TEXT PRIMARY KEY, server_url TEXT NOT NULL, vault_id TEXT NOT NULL,
    private_key BLOB NOT NULL, fingerprint TEXT NOT NULL, label TEXT NOT NULL,
    created_at TEXT NOT NULL, expires_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sync_handoff_pake (
    request_id TEXT PRIMARY KEY, pairing_id TEXT NOT NULL, state BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS sync_pairing_code (
    pairing_id TEXT NOT NULL, role TEXT NOT NULL CHECK (role IN ('admin', 'requester')),
    server_url TEXT NOT NULL, vault_id TEXT NOT NULL, code TEXT NOT NULL,
    created_at TEXT NOT NULL, keep_until REAL NOT NULL, PRIMARY KEY (pairing_id, role));
INSERT INTO sync_known_clocks VALUES ('mem_a', 7, 'dev_1', '2026-01-01T00:00:00Z');
INSERT INTO sync_pending_links VALUES ('mem_a', 'mem_b', 'causal', 0.5);
INSERT INTO sync_vault_key_expected VALUES ('vault-1', 'pairing', '2026-01-01T00:00:00Z');
"""


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh Engram vault (schema v10) without any client table."""
    path = tmp_path_factory.mktemp("template") / "vault"
    open_vault(path, PASSPHRASE, create=True).close()
    return path


@pytest.fixture
def vault_dir(template: Path, tmp_path: Path) -> Path:
    path = tmp_path / "vault"
    shutil.copytree(template, path)
    return path


def _tables(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {str(r[0]) for r in rows}


def _engram_schema(conn: sqlite3.Connection) -> list[tuple[str, str, str | None]]:
    """Everything in sqlite_master that is not ours, and the Engram user_version: ours are
    the sync_ tables and, on the Engram tables, exactly OURS_ON_ENGRAM_TABLES."""
    ours = conn.execute(
        "SELECT type, name, tbl_name FROM sqlite_master"
        " WHERE name LIKE 'sync!_%' ESCAPE '!' AND tbl_name NOT LIKE 'sync!_%' ESCAPE '!'"
    ).fetchall()
    assert {tuple(r) for r in ours} in (set(), OURS_ON_ENGRAM_TABLES)
    rows = conn.execute(
        "SELECT type, name, sql FROM sqlite_master"
        " WHERE (tbl_name NOT LIKE 'sync!_%' ESCAPE '!' OR tbl_name = 'sync_conflicts')"
        " AND NOT (name LIKE 'sync!_%' ESCAPE '!' AND type IN ('index', 'trigger'))"
        " ORDER BY type, name"
    ).fetchall()
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    return [(str(t), str(n), s) for t, n, s in rows] + [("pragma", "user_version", str(version))]


def _dump(conn: sqlite3.Connection) -> dict[str, list[tuple[object, ...]]]:
    return {
        name: sorted(conn.execute(f"SELECT * FROM {name}").fetchall())
        for name in sorted(_tables(conn))
    }


def _old_vault(vault_dir: Path) -> None:
    with open_vault(vault_dir, PASSPHRASE) as vault:
        vault.conn.executescript(OLD_SQL)


def test_a_fresh_vault_gets_the_tables_and_the_version(vault_dir: Path) -> None:
    with open_vault(vault_dir, PASSPHRASE) as vault:
        before = _engram_schema(vault.conn)
        assert _tables(vault.conn).isdisjoint(SYNC_TABLES | {"sync_schema"})
    with VaultSession.open(vault_dir, PASSPHRASE) as session:
        conn = session.vault.conn
        assert SYNC_TABLES | {"sync_schema"} <= _tables(conn)
        assert schema_version(conn) == SCHEMA_VERSION == len(local_schema.MIGRATIONS)
        assert conn.execute("SELECT id, version FROM sync_schema").fetchall() == [
            (1, SCHEMA_VERSION)
        ]
        # VAULT §3: the Engram tables and user_version are exactly what open_vault made
        assert _engram_schema(conn) == before
        # migration 5: a vault with no version yet starts at the empty digest (issue 36)
        assert conn.execute("SELECT * FROM sync_digest").fetchall() == [(1, bytes(32), 0)]
        assert conn.execute("PRAGMA user_version").fetchone()[0] == ENGRAM_SCHEMA_VERSION


def test_an_old_vault_is_upgraded_and_keeps_its_rows(vault_dir: Path) -> None:
    _old_vault(vault_dir)
    with open_vault(vault_dir, PASSPHRASE) as vault:
        assert schema_version(vault.conn) == 0
        before = _dump(vault.conn)
        engram_before = _engram_schema(vault.conn)
    with VaultSession.open(vault_dir, PASSPHRASE) as session:
        conn = session.vault.conn
        assert schema_version(conn) == SCHEMA_VERSION
        after = _dump(conn)
        assert after.pop("sync_schema") == [(1, SCHEMA_VERSION)]
        assert after.pop("sync_digest_compacted") == []  # migration 2, new and empty
        assert after.pop("sync_local_deletions") == []  # migration 3 (docs/privacy.md)
        assert after.pop("sync_retractions") == []
        assert after.pop("sync_history") == []  # migration 4 (docs/history.md)
        assert after.pop("sync_history_meta") == [(1, 0, None, 30.0, 10.0, 1 << 20)]
        # migration 5: a vault that holds versions has no kept digest until its next check
        assert after.pop("sync_digest") == []
        assert after.pop("sync_digest_dirty") == []
        assert after.pop("sync_kept_out") == []  # migration 6 (strict_local's kept-out copies)
        assert after == before
        assert after["sync_known_clocks"] == [("mem_a", 7, "dev_1", "2026-01-01T00:00:00Z")]
        assert _engram_schema(conn) == engram_before


def test_opening_twice_is_idempotent(vault_dir: Path) -> None:
    with VaultSession.open(vault_dir, PASSPHRASE) as session:
        session.vault.conn.execute(
            "INSERT INTO sync_known_clocks VALUES ('mem_x', 3, 'dev_2', '2026-02-01T00:00:00Z')"
        )
        first = _dump(session.vault.conn)
        schema = session.vault.conn.execute("SELECT * FROM sqlite_master ORDER BY name").fetchall()
        assert migrate(session.vault.conn) == SCHEMA_VERSION  # again, on the same connection
    with VaultSession.open(vault_dir, PASSPHRASE) as session:
        conn = session.vault.conn
        assert _dump(conn) == first
        assert conn.execute("SELECT * FROM sqlite_master ORDER BY name").fetchall() == schema


def test_a_newer_sync_schema_is_refused_and_left_unchanged(vault_dir: Path) -> None:
    with VaultSession.open(vault_dir, PASSPHRASE) as session:
        session.vault.conn.execute("UPDATE sync_schema SET version = ?", (SCHEMA_VERSION + 1,))
        session.vault.conn.execute("DROP TABLE sync_pairing_code")  # a newer one may have
        before = _dump(session.vault.conn)
        schema = session.vault.conn.execute("SELECT * FROM sqlite_master ORDER BY name").fetchall()
    with pytest.raises(LocalSchemaTooNewError, match="upgrade engram-sync") as raised:
        VaultSession.open(vault_dir, PASSPHRASE)
    assert "\n" not in str(raised.value)
    assert f"version {SCHEMA_VERSION + 1}" in str(raised.value)
    with open_vault(vault_dir, PASSPHRASE) as vault:
        assert _dump(vault.conn) == before  # migration 1 did not recreate the table
        assert vault.conn.execute("SELECT * FROM sqlite_master ORDER BY name").fetchall() == schema
        # the version this code knows opens (the positive case beside the refusal)
        vault.conn.execute("UPDATE sync_schema SET version = ?", (SCHEMA_VERSION,))
    with VaultSession.open(vault_dir, PASSPHRASE) as session:
        assert schema_version(session.vault.conn) == SCHEMA_VERSION


def test_a_failed_migration_leaves_nothing_behind(
    vault_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One transaction: a step that fails rolls back the steps before it and the version."""
    broken = (*local_schema.MIGRATIONS[0], "CREATE TABLE sync_known_clocks (x)")
    monkeypatch.setattr(local_schema, "MIGRATIONS", (broken,))
    with open_vault(vault_dir, PASSPHRASE) as vault:
        before = vault.conn.execute("SELECT * FROM sqlite_master ORDER BY name").fetchall()
        with pytest.raises(sqlcipher3.OperationalError, match="already exists"):
            migrate(vault.conn)
        assert not vault.conn.in_transaction
        assert vault.conn.execute("SELECT * FROM sqlite_master ORDER BY name").fetchall() == before
        assert schema_version(vault.conn) == 0


def test_opening_leaves_the_row_factory_alone(vault_dir: Path) -> None:
    with open_vault(vault_dir, PASSPHRASE) as vault:
        factory = vault.conn.row_factory
    with VaultSession.open(vault_dir, PASSPHRASE) as session:
        conn = session.vault.conn
        assert conn.row_factory is factory
        assert type(conn.execute("SELECT 1").fetchone()) is tuple


def test_the_cli_refuses_a_newer_sync_schema_in_one_line(tmp_path: Path) -> None:
    vault = tmp_path / "vault"
    env = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE, HOME=str(tmp_path))
    env.pop("ENGRAM_VAULT", None)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [EXE, "--vault", str(vault), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    assert cli("init").returncode == 0
    assert cli("status").returncode == 0  # the positive case: the version this code knows
    with open_vault(vault, PASSPHRASE) as opened:
        opened.conn.execute("UPDATE sync_schema SET version = ?", (SCHEMA_VERSION + 1,))
    refused = cli("status")
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines() == [
        f"error: this vault's sync tables are at version {SCHEMA_VERSION + 1}, newer than this"
        f" engram-sync knows ({SCHEMA_VERSION}): upgrade engram-sync"
    ]
