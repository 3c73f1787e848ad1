"""Schema v10 (VAULT §3) and the sync_conflicts table (PROTOCOL §8), on real SQLCipher vaults.

The expected tables below are transcribed by hand from VAULT.md, not derived
from engram_sync.shared_format.vault.schema, so they check the implementation independently.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_sync.shared_format.errors import VaultError
from engram_sync.shared_format.vault import (
    SOURCES,
    IntegrityError,
    Vault,
    normalized_hash,
    open_vault,
)

from ..vault_md import ENGRAM_SOURCES
from .helpers import machine_key, make_db, raw_connect, this_machine

# (name, type, notnull, dflt_value, pk) as PRAGMA table_info reports them.
Row = tuple[str, str, int, str | None, int]

EXPECTED_COLUMNS: dict[str, list[Row]] = {
    "engrams": [
        ("id", "TEXT", 0, None, 1),
        ("layer", "TEXT", 1, None, 0),
        ("source", "TEXT", 1, "'interaction'", 0),
        ("privacy_level", "TEXT", 1, "'cloud_first'", 0),
        ("content", "TEXT", 1, None, 0),
        ("context", "TEXT", 1, None, 0),
        ("strength", "REAL", 1, "1.0", 0),
        ("valence", "REAL", 1, "0.0", 0),
        ("retrievals", "INTEGER", 1, "0", 0),
        ("imagined", "INTEGER", 1, "0", 0),
        ("grounded", "INTEGER", 1, "0", 0),
        ("created_at", "TEXT", 1, None, 0),
        ("last_retrieved", "TEXT", 0, None, 0),
        ("project", "TEXT", 0, None, 0),
        ("tags", "TEXT", 0, None, 0),
        ("content_hash", "TEXT", 0, None, 0),
        ("scope", "TEXT", 1, "'moment'", 0),
        ("content_type", "TEXT", 1, "'text'", 0),
        ("occurred_at", "TEXT", 0, None, 0),
        ("modified_at", "TEXT", 0, None, 0),
        ("synced_at", "TEXT", 0, None, 0),
        ("agent_id", "TEXT", 0, None, 0),
    ],
    "engram_links": [
        ("source_id", "TEXT", 1, None, 1),
        ("target_id", "TEXT", 1, None, 2),
        ("weight", "REAL", 1, "0.5", 0),
        ("link_type", "TEXT", 1, None, 0),
    ],
    "engram_embeddings": [
        ("engram_id", "TEXT", 0, None, 1),
        ("embedding", "BLOB", 1, None, 0),
        ("model", "TEXT", 1, "'all-MiniLM-L6-v2'", 0),
        ("dimensions", "INTEGER", 1, "384", 0),
        ("created_at", "TEXT", 1, None, 0),
    ],
    "tombstones": [
        ("id", "TEXT", 0, None, 1),
        ("deleted_at", "TEXT", 1, None, 0),
    ],
    "access_events": [
        ("id", "INTEGER", 0, None, 1),
        ("memory_id", "TEXT", 1, None, 0),
        ("op", "TEXT", 1, None, 0),
        ("client", "TEXT", 1, "'http'", 0),
        ("content_hash", "TEXT", 0, None, 0),
        ("at", "TEXT", 1, None, 0),
    ],
    "coherence_state": [
        ("id", "INTEGER", 0, "1", 1),
        ("baseline_valence", "REAL", 1, "0.3", 0),
        ("character_strengths", "TEXT", 1, None, 0),
        ("purpose_vector", "TEXT", 1, None, 0),
        ("last_hygiene_daily", "TEXT", 0, None, 0),
        ("last_hygiene_weekly", "TEXT", 0, None, 0),
        ("drift_score", "REAL", 0, "0.0", 0),
        ("updated_at", "TEXT", 1, None, 0),
    ],
    "goals": [
        ("id", "TEXT", 0, None, 1),
        ("description", "TEXT", 1, None, 0),
        ("pathways", "TEXT", 1, None, 0),
        ("agency_score", "REAL", 0, "0.5", 0),
        ("created_at", "TEXT", 1, None, 0),
        ("status", "TEXT", 0, "'active'", 0),
    ],
    "consolidation_runs": [
        ("id", "TEXT", 0, None, 1),
        ("run_at", "TEXT", 1, None, 0),
        ("episodes_processed", "INTEGER", 0, None, 0),
        ("semantics_created", "INTEGER", 0, None, 0),
        ("engrams_decayed", "INTEGER", 0, None, 0),
        ("notes", "TEXT", 0, None, 0),
    ],
    "app_metrics": [
        ("key", "TEXT", 0, None, 1),
        ("value", "INTEGER", 1, None, 0),
    ],
    "memory_evidence": [
        ("memory_id", "TEXT", 1, None, 1),
        ("evidence_id", "TEXT", 1, None, 2),
        ("relationship", "TEXT", 1, "'supports'", 0),
    ],
    "annotations": [
        ("id", "TEXT", 0, None, 1),
        ("memory_id", "TEXT", 1, None, 0),
        ("content", "TEXT", 1, None, 0),
        ("created_at", "TEXT", 1, None, 0),
    ],
    "saved_searches": [
        ("id", "TEXT", 0, None, 1),
        ("query", "TEXT", 1, "''", 0),
        ("layer", "TEXT", 0, None, 0),
        ("tags", "TEXT", 0, None, 0),
        ("notify", "INTEGER", 1, "0", 0),
        ("created_at", "TEXT", 1, None, 0),
        ("last_checked_at", "TEXT", 0, None, 0),
    ],
    "sync_conflicts": [
        ("id", "INTEGER", 0, None, 1),
        ("memory_id", "TEXT", 1, None, 0),
        ("local_plaintext", "TEXT", 1, None, 0),
        ("local_modified_at", "TEXT", 0, None, 0),
        ("remote_device_id", "TEXT", 1, None, 0),
        ("remote_vector_clock", "INTEGER", 1, None, 0),
        ("remote_deleted", "INTEGER", 1, "0", 0),
        ("detected_at", "TEXT", 1, None, 0),
        ("restored_at", "TEXT", 0, None, 0),
    ],
}

# (from column, to table, to column, on_delete) per table, as PRAGMA foreign_key_list reports.
EXPECTED_FOREIGN_KEYS: dict[str, set[tuple[str, str, str, str]]] = {
    "engram_links": {
        ("source_id", "engrams", "id", "CASCADE"),
        ("target_id", "engrams", "id", "CASCADE"),
    },
    "engram_embeddings": {("engram_id", "engrams", "id", "CASCADE")},
    "memory_evidence": {
        ("memory_id", "engrams", "id", "CASCADE"),
        ("evidence_id", "engrams", "id", "CASCADE"),
    },
    "annotations": {("memory_id", "engrams", "id", "CASCADE")},
}

EXPECTED_INDEXES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    name: (name, table, columns)
    for name, table, columns in [
        ("idx_engrams_layer", "engrams", ("layer",)),
        ("idx_engrams_source", "engrams", ("source",)),
        ("idx_engrams_created_at", "engrams", ("created_at",)),
        ("idx_engrams_imagined", "engrams", ("imagined",)),
        ("idx_engrams_content_hash", "engrams", ("content_hash",)),
        ("idx_engrams_modified_at", "engrams", ("modified_at",)),
        ("idx_engrams_agent_id", "engrams", ("agent_id",)),
        ("idx_engram_links_source", "engram_links", ("source_id",)),
        ("idx_engram_links_target", "engram_links", ("target_id",)),
        ("idx_embeddings_created", "engram_embeddings", ("created_at",)),
        ("idx_memory_evidence_memory", "memory_evidence", ("memory_id",)),
        ("idx_memory_evidence_evidence", "memory_evidence", ("evidence_id",)),
        ("idx_annotations_memory", "annotations", ("memory_id",)),
        ("idx_access_events_at", "access_events", ("at",)),
        ("idx_access_events_memory", "access_events", ("memory_id",)),
        ("idx_sync_conflicts_memory", "sync_conflicts", ("memory_id",)),
    ]
}

NOW = "2026-01-01T00:00:00.000000+00:00"


def table_info(vault: Vault, table: str) -> list[Row]:
    return [
        (name, type_, notnull, default, pk)
        for _cid, name, type_, notnull, default, pk in vault.conn.execute(
            f"PRAGMA table_info({table})"
        )
    ]


def created_indexes(vault: Vault) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """Every explicitly created index: name -> (name, table, columns)."""
    found = {}
    tables = [
        row[0]
        for row in vault.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    for table in tables:
        for _seq, name, _unique, origin, _partial in vault.conn.execute(
            f"PRAGMA index_list({table})"
        ).fetchall():
            if origin != "c":
                continue
            info = sorted(vault.conn.execute(f"PRAGMA index_info({name})").fetchall())
            found[name] = (name, table, tuple(column for _seqno, _cid, column in info))
    return found


def schema_dump(vault: Vault) -> list[tuple[Any, ...]]:
    return vault.conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
    ).fetchall()


def insert_engram(vault: Vault, engram_id: str, **columns: Any) -> None:
    values: dict[str, Any] = {
        "id": engram_id,
        "layer": "semantic",
        "content": f"content of {engram_id}",
        "context": "{}",
        "created_at": NOW,
        **columns,
    }
    names = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    vault.conn.execute(f"INSERT INTO engrams ({names}) VALUES ({marks})", tuple(values.values()))


@pytest.fixture(scope="module")
def vault_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("schema")
    open_vault(directory, None, create=True, machine_id=this_machine).close()
    return directory


@pytest.fixture(scope="module")
def shared_vault(vault_dir: Path) -> Iterator[Vault]:
    with open_vault(vault_dir, None, machine_id=this_machine) as vault:
        yield vault


@pytest.fixture
def vault(shared_vault: Vault) -> Iterator[Vault]:
    """The module's vault inside a transaction that is rolled back after the test."""
    shared_vault.conn.execute("BEGIN")
    try:
        yield shared_vault
    finally:
        shared_vault.conn.execute("ROLLBACK")


# -- shape -----------------------------------------------------------------------------------


def test_user_version(vault: Vault) -> None:
    assert vault.conn.execute("PRAGMA user_version").fetchone() == (10,)


@pytest.mark.parametrize("table", sorted(EXPECTED_COLUMNS))
def test_table_columns(vault: Vault, table: str) -> None:
    assert table_info(vault, table) == EXPECTED_COLUMNS[table]


def test_no_unexpected_tables(vault: Vault) -> None:
    tables = {
        row[0]
        for row in vault.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
            " AND name NOT LIKE 'sqlite_%' AND name NOT LIKE 'engrams_fts_%'"
        )
    }
    assert tables == {*EXPECTED_COLUMNS, "engrams_fts"}


@pytest.mark.parametrize("table", sorted(EXPECTED_COLUMNS))
def test_foreign_keys(vault: Vault, table: str) -> None:
    found = {
        (row[3], row[2], row[4], row[6])
        for row in vault.conn.execute(f"PRAGMA foreign_key_list({table})")
    }
    assert found == EXPECTED_FOREIGN_KEYS.get(table, set())


def test_autoincrement_tables(vault: Vault) -> None:
    for table in ("access_events", "sync_conflicts"):
        sql = vault.conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = ?", (table,)
        ).fetchone()[0]
        assert "id INTEGER PRIMARY KEY AUTOINCREMENT" in sql


def test_indexes(vault: Vault) -> None:
    assert created_indexes(vault) == EXPECTED_INDEXES


def test_fts_table(vault: Vault) -> None:
    sql = vault.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'engrams_fts'").fetchone()
    assert sql == ("CREATE VIRTUAL TABLE engrams_fts USING fts5(id, content)",)
    assert [row[1] for row in vault.conn.execute("PRAGMA table_info(engrams_fts)")] == [
        "id",
        "content",
    ]
    assert not vault.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'trigger'").fetchall()
    insert_engram(vault, "eng_fts", content="deploy the relay")
    vault.conn.execute(
        "INSERT INTO engrams_fts(rowid, id, content)"
        " SELECT rowid, id, content FROM engrams WHERE id = 'eng_fts'"
    )
    hits = vault.conn.execute(
        "SELECT e.id FROM engrams_fts f JOIN engrams e ON e.rowid = f.rowid"
        " WHERE engrams_fts MATCH 'relay'"
    ).fetchall()
    assert hits == [("eng_fts",)]


def test_defaults(vault: Vault) -> None:
    insert_engram(vault, "eng_d")
    row = vault.conn.execute(
        "SELECT source, privacy_level, strength, valence, retrievals, imagined, grounded,"
        " scope, content_type FROM engrams WHERE id = 'eng_d'"
    ).fetchone()
    assert row == ("interaction", "cloud_first", 1.0, 0.0, 0, 0, 0, "moment", "text")


# -- CHECK constraints -----------------------------------------------------------------------


def test_the_schema_sources_are_vault_md_s() -> None:
    assert SOURCES == ENGRAM_SOURCES


@pytest.mark.parametrize("source", ENGRAM_SOURCES)
def test_every_v10_source_is_accepted(vault: Vault, source: str) -> None:
    insert_engram(vault, f"eng_{source}", source=source)


@pytest.mark.parametrize(
    "columns",
    [
        {"layer": "dream"},
        {"source": "ai_session"},
        {"source": "email"},
        {"privacy_level": "public"},
        {"valence": 1.5},
        {"valence": -1.01},
        {"layer": None},
        {"content": None},
        {"context": None},
        {"created_at": None},
        {"scope": None},
    ],
)
def test_engrams_checks(vault: Vault, columns: dict[str, Any]) -> None:
    with pytest.raises(IntegrityError):
        insert_engram(vault, "eng_bad", **columns)


def test_valence_bounds_are_inclusive(vault: Vault) -> None:
    insert_engram(vault, "eng_lo", valence=-1.0)
    insert_engram(vault, "eng_hi", valence=1.0)


@pytest.mark.parametrize(
    ("sql", "params"),
    [
        ("INSERT INTO engram_links (source_id, target_id, link_type) VALUES ('a', 'b', ?)", ("x",)),
        ("INSERT INTO access_events (memory_id, op, at) VALUES ('a', ?, 'now')", ("read",)),
        ("INSERT INTO goals (id, description, pathways, created_at, status)"
         " VALUES ('g', 'd', '[]', 'now', ?)", ("done",)),
    ],
)  # fmt: skip
def test_other_checks(vault: Vault, sql: str, params: tuple[Any, ...]) -> None:
    insert_engram(vault, "a")
    insert_engram(vault, "b")
    with pytest.raises(IntegrityError):
        vault.conn.execute(sql, params)


def test_allowed_enumerations_of_other_tables(vault: Vault) -> None:
    insert_engram(vault, "a")
    insert_engram(vault, "b")
    for i, link_type in enumerate(("associative", "causal", "analogical", "temporal")):
        insert_engram(vault, f"t{i}")
        vault.conn.execute(
            "INSERT INTO engram_links (source_id, target_id, link_type) VALUES ('a', ?, ?)",
            (f"t{i}", link_type),
        )
    for op in ("get", "search_hit", "export"):
        vault.conn.execute(
            "INSERT INTO access_events (memory_id, op, at) VALUES ('gone', ?, 'now')", (op,)
        )
    for status in ("active", "achieved", "released", None):
        vault.conn.execute(
            "INSERT INTO goals (id, description, pathways, created_at, status)"
            " VALUES (?, 'd', '[]', 'now', ?)",
            (f"g{status}", status),
        )


# -- foreign keys ----------------------------------------------------------------------------


def test_foreign_keys_are_enforced(vault: Vault) -> None:
    insert_engram(vault, "a")
    with pytest.raises(IntegrityError):
        vault.conn.execute(
            "INSERT INTO engram_links (source_id, target_id, link_type)"
            " VALUES ('a', 'missing', 'causal')"
        )
    with pytest.raises(IntegrityError):
        vault.conn.execute(
            "INSERT INTO annotations (id, memory_id, content, created_at)"
            " VALUES ('n', 'missing', 'c', 'now')"
        )


def test_delete_cascades(vault: Vault) -> None:
    insert_engram(vault, "a")
    insert_engram(vault, "b")
    conn = vault.conn
    conn.execute(
        "INSERT INTO engram_links (source_id, target_id, link_type) VALUES ('a', 'b', 'causal')"
    )
    conn.execute(
        "INSERT INTO engram_embeddings (engram_id, embedding, created_at) VALUES ('a', x'00', 'n')"
    )
    conn.execute("INSERT INTO memory_evidence (memory_id, evidence_id) VALUES ('b', 'a')")
    conn.execute(
        "INSERT INTO annotations (id, memory_id, content, created_at) VALUES ('n', 'a', 'c', 'n')"
    )
    conn.execute("INSERT INTO access_events (memory_id, op, at) VALUES ('a', 'get', 'n')")
    conn.execute("DELETE FROM engrams WHERE id = 'a'")
    for table in ("engram_links", "engram_embeddings", "memory_evidence", "annotations"):
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table
    # access_events has no foreign key on purpose.
    assert conn.execute("SELECT count(*) FROM access_events").fetchone() == (1,)


def test_sync_conflicts_outlive_their_memory(vault: Vault) -> None:
    insert_engram(vault, "a")
    vault.conn.execute(
        "INSERT INTO sync_conflicts (memory_id, local_plaintext, local_modified_at,"
        " remote_device_id, remote_vector_clock, remote_deleted, detected_at)"
        " VALUES ('a', '{\"id\":\"a\"}', ?, 'dev-2', 7, 1, ?)",
        (NOW, NOW),
    )
    vault.conn.execute("DELETE FROM engrams WHERE id = 'a'")
    row = vault.conn.execute(
        "SELECT memory_id, remote_vector_clock, remote_deleted, restored_at FROM sync_conflicts"
    ).fetchone()
    assert row == ("a", 7, 1, None)


# -- idempotence and upgrades ----------------------------------------------------------------


def test_opening_again_changes_nothing(tmp_path: Path) -> None:
    with open_vault(tmp_path, None, create=True, machine_id=this_machine) as vault:
        insert_engram(vault, "a")
        first = schema_dump(vault)
    with open_vault(tmp_path, None, machine_id=this_machine) as vault:
        assert schema_dump(vault) == first
        assert vault.conn.execute("SELECT id FROM engrams").fetchall() == [("a",)]
        assert vault.conn.execute("PRAGMA user_version").fetchone() == (10,)


# An Engram vault from before the push cursor and the slack/discord/telegram sources:
# fewer engrams columns, an older source CHECK, an external-content FTS table kept in
# sync by triggers, an index under another name, a view, and user_version 3.
OLD_SOURCES = (
    "'interaction','sensor','consolidation','imagined','chat','window','mic','agent',"
    "'research','system','user','observation','ai-session','ai-tool'"
)
OLD_VAULT = f"""
CREATE TABLE engrams (
    id              TEXT PRIMARY KEY,
    layer           TEXT NOT NULL CHECK(layer IN ('episodic','semantic','imagined')),
    source          TEXT NOT NULL DEFAULT 'interaction' CHECK(source IN ({OLD_SOURCES})),
    privacy_level   TEXT NOT NULL DEFAULT 'cloud_first'
                    CHECK(privacy_level IN ('strict_local','hybrid','cloud_first','enterprise')),
    content         TEXT NOT NULL,
    context         TEXT NOT NULL,
    strength        REAL NOT NULL DEFAULT 1.0,
    valence         REAL NOT NULL DEFAULT 0.0 CHECK(valence BETWEEN -1.0 AND 1.0),
    retrievals      INTEGER NOT NULL DEFAULT 0,
    imagined        INTEGER NOT NULL DEFAULT 0,
    grounded        INTEGER NOT NULL DEFAULT 0,
    created_at      TEXT NOT NULL,
    last_retrieved  TEXT,
    project         TEXT,
    tags            TEXT,
    legacy_note     TEXT DEFAULT 'n/a'
);
CREATE TABLE engram_links (
    source_id TEXT NOT NULL REFERENCES engrams(id) ON DELETE CASCADE,
    target_id TEXT NOT NULL REFERENCES engrams(id) ON DELETE CASCADE,
    weight REAL NOT NULL DEFAULT 0.5,
    link_type TEXT NOT NULL CHECK(link_type IN ('associative','causal','analogical','temporal')),
    PRIMARY KEY (source_id, target_id)
);
CREATE INDEX idx_engrams_layer ON engrams(layer);
CREATE INDEX idx_engrams_by_project ON engrams(project);
CREATE VIEW recent AS SELECT id FROM engrams ORDER BY created_at DESC;
CREATE VIRTUAL TABLE engrams_fts USING fts5(content, content='engrams', content_rowid='rowid');
CREATE TRIGGER engrams_ai AFTER INSERT ON engrams BEGIN
    INSERT INTO engrams_fts(rowid, content) VALUES (new.rowid, new.content);
END;
INSERT INTO engrams (id, layer, content, context, created_at, legacy_note) VALUES
    ('eng_old1', 'episodic', '[12] Deploy  the RELAY', '{{}}', '2025-01-01T00:00:00+00:00', 'x'),
    ('eng_old2', 'semantic', 'second memory', '{{}}', '2025-02-01T00:00:00+00:00', NULL);
INSERT INTO engram_links (source_id, target_id, link_type)
    VALUES ('eng_old1', 'eng_old2', 'causal');
-- Non-consecutive rowids, so that copying the rows without their rowids would show.
UPDATE engrams SET rowid = rowid + 40 WHERE id = 'eng_old1';
PRAGMA user_version = 3;
"""


@pytest.fixture(scope="module")
def upgraded_vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vault]:
    directory = tmp_path_factory.mktemp("old")
    make_db(directory / "engrams.db", machine_key(), OLD_VAULT)
    with open_vault(directory, None, machine_id=this_machine) as vault:
        yield vault


def test_upgrade_reaches_v10(upgraded_vault: Vault) -> None:
    conn = upgraded_vault.conn
    assert conn.execute("PRAGMA user_version").fetchone() == (10,)
    # The outdated source CHECK forced a rebuild: v10 columns in v10 order, then the extra one.
    assert table_info(upgraded_vault, "engrams") == [
        *EXPECTED_COLUMNS["engrams"],
        ("legacy_note", "TEXT", 0, "'n/a'", 0),
    ]
    for table, expected in EXPECTED_COLUMNS.items():
        if table != "engrams":
            assert table_info(upgraded_vault, table) == expected, table
    assert conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_upgrade_keeps_rows_rowids_and_links(upgraded_vault: Vault) -> None:
    conn = upgraded_vault.conn
    rows = conn.execute(
        "SELECT rowid, id, content, legacy_note, scope, content_type, modified_at, synced_at,"
        " content_hash FROM engrams ORDER BY id"
    ).fetchall()
    assert rows == [
        (41, "eng_old1", "[12] Deploy  the RELAY", "x", "moment", "text",
         "2025-01-01T00:00:00+00:00", None, normalized_hash("deploy the relay")),
        (2, "eng_old2", "second memory", None, "moment", "text",
         "2025-02-01T00:00:00+00:00", None, normalized_hash("second memory")),
    ]  # fmt: skip
    assert conn.execute("SELECT source_id, target_id FROM engram_links").fetchall() == [
        ("eng_old1", "eng_old2")
    ]
    assert conn.execute("SELECT id FROM recent").fetchall() == [("eng_old2",), ("eng_old1",)]


def test_upgrade_rebuilds_fts_without_triggers(upgraded_vault: Vault) -> None:
    conn = upgraded_vault.conn
    assert conn.execute("SELECT sql FROM sqlite_master WHERE name = 'engrams_fts'").fetchone() == (
        "CREATE VIRTUAL TABLE engrams_fts USING fts5(id, content)",
    )
    assert conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall() == []
    hits = conn.execute(
        "SELECT e.id, f.id FROM engrams_fts f JOIN engrams e ON e.rowid = f.rowid"
        " WHERE engrams_fts MATCH 'relay'"
    ).fetchall()
    assert hits == [("eng_old1", "eng_old1")]


def test_upgrade_indexes(upgraded_vault: Vault) -> None:
    indexes = created_indexes(upgraded_vault)
    assert indexes["idx_engrams_by_project"] == ("idx_engrams_by_project", "engrams", ("project",))
    assert {name: spec for name, spec in indexes.items() if name != "idx_engrams_by_project"} == (
        EXPECTED_INDEXES
    )


def test_upgrade_accepts_new_sources_and_cascades(upgraded_vault: Vault) -> None:
    conn = upgraded_vault.conn
    conn.execute("BEGIN")
    try:
        insert_engram(upgraded_vault, "eng_slack", source="slack")
        conn.execute("DELETE FROM engrams WHERE id = 'eng_old2'")
        assert conn.execute("SELECT count(*) FROM engram_links").fetchone() == (0,)
    finally:
        conn.execute("ROLLBACK")


def test_column_only_upgrade_adds_columns_in_place(tmp_path: Path) -> None:
    # A vault whose source CHECK is current but which predates the push cursor columns.
    script = (
        "CREATE TABLE engrams (id TEXT PRIMARY KEY, layer TEXT NOT NULL, source TEXT NOT NULL"
        f" DEFAULT 'interaction' CHECK (source IN ({', '.join(repr(s) for s in ENGRAM_SOURCES)})),"
        " privacy_level TEXT NOT NULL DEFAULT 'cloud_first', content TEXT NOT NULL,"
        " context TEXT NOT NULL, strength REAL NOT NULL DEFAULT 1.0,"
        " valence REAL NOT NULL DEFAULT 0.0, retrievals INTEGER NOT NULL DEFAULT 0,"
        " imagined INTEGER NOT NULL DEFAULT 0, grounded INTEGER NOT NULL DEFAULT 0,"
        " created_at TEXT NOT NULL, last_retrieved TEXT, project TEXT, tags TEXT,"
        " content_hash TEXT, scope TEXT NOT NULL DEFAULT 'moment',"
        " content_type TEXT NOT NULL DEFAULT 'text', occurred_at TEXT);"
        "INSERT INTO engrams (id, layer, content, context, created_at, content_hash)"
        " VALUES ('a', 'semantic', 'x', '{}', '2025-01-01T00:00:00+00:00', 'given');"
        "PRAGMA user_version = 9;"
    )
    make_db(tmp_path / "engrams.db", machine_key(), script)
    with open_vault(tmp_path, None, machine_id=this_machine) as vault:
        sql = vault.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'engrams'").fetchone()
        assert "layer TEXT NOT NULL," in sql[0]  # not rebuilt: the original CHECK-less layer
        assert [row[0] for row in table_info(vault, "engrams")] == [
            row[0] for row in EXPECTED_COLUMNS["engrams"]
        ]
        assert table_info(vault, "engrams")[-3:] == EXPECTED_COLUMNS["engrams"][-3:]
        row = vault.conn.execute(
            "SELECT modified_at, synced_at, agent_id, content_hash FROM engrams"
        ).fetchone()
        assert row == ("2025-01-01T00:00:00+00:00", None, None, "given")
        assert vault.conn.execute("PRAGMA user_version").fetchone() == (10,)


def test_newer_user_version_is_kept(tmp_path: Path) -> None:
    make_db(tmp_path / "engrams.db", machine_key(), "PRAGMA user_version = 12;")
    with open_vault(tmp_path, None, machine_id=this_machine) as vault:
        assert vault.conn.execute("PRAGMA user_version").fetchone() == (12,)
        assert table_info(vault, "engrams") == EXPECTED_COLUMNS["engrams"]


def test_failed_upgrade_claims_nothing(tmp_path: Path) -> None:
    # An engrams table without `layer` (NOT NULL, no default) cannot be upgraded in place.
    script = (
        "CREATE TABLE engrams (id TEXT PRIMARY KEY, content TEXT NOT NULL);"
        "INSERT INTO engrams VALUES ('a', 'x');"
        "PRAGMA user_version = 2;"
    )
    make_db(tmp_path / "engrams.db", machine_key(), script)
    with pytest.raises(VaultError, match="layer"):
        open_vault(tmp_path, None, machine_id=this_machine)
    conn = raw_connect(tmp_path / "engrams.db", machine_key())
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (2,)
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        assert tables == [("engrams",)]  # everything else was rolled back
    finally:
        conn.close()
