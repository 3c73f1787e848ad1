"""Schema v10 of the vault database, applied idempotently on every open (VAULT §3).

Tables and indexes are described as data (`TABLES`, `INDEXES`) so the same
description produces the `CREATE TABLE IF NOT EXISTS` statements and the
idempotent "ensure" steps that add columns an older vault lacks. Everything
runs in one transaction and `PRAGMA user_version = 10` is written last, so a
vault that failed mid-upgrade never claims a version it does not have.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from typing import Final

from ..errors import VaultError
from ..plaintext import SOURCES
from .content_hash import normalized_hash
from .sqlcipher import DatabaseError

SCHEMA_VERSION: Final = 10

# VAULT §3 / §5 enumerations, in the database spelling (SOURCES: shared_format.plaintext).
LAYERS: Final = ("episodic", "semantic", "imagined")
PRIVACY_LEVELS: Final = ("strict_local", "hybrid", "cloud_first", "enterprise")
LINK_TYPES: Final = ("associative", "causal", "analogical", "temporal")
ACCESS_OPS: Final = ("get", "search_hit", "export")
GOAL_STATUSES: Final = ("active", "achieved", "released")


def _in(column: str, values: tuple[str, ...]) -> str:
    """A CHECK expression `column IN ('a', 'b', ...)`."""
    quoted = ", ".join("'" + value + "'" for value in values)
    return f"{column} IN ({quoted})"


@dataclass(frozen=True)
class Column:
    """One column: its declaration is generated from these fields."""

    name: str
    type: str
    not_null: bool = False
    default: str | None = None  # SQL literal text, e.g. "'interaction'" or "1.0"
    check: str | None = None  # CHECK expression
    primary_key: bool = False
    autoincrement: bool = False
    references_engrams: bool = False  # REFERENCES engrams(id) ON DELETE CASCADE

    def definition(self) -> str:
        """The column definition as it appears in CREATE TABLE / ADD COLUMN."""
        parts = [self.name, self.type]
        if self.primary_key:
            parts.append("PRIMARY KEY AUTOINCREMENT" if self.autoincrement else "PRIMARY KEY")
        if self.not_null:
            parts.append("NOT NULL")
        if self.default is not None:
            parts.append(f"DEFAULT {self.default}")
        if self.check is not None:
            parts.append(f"CHECK ({self.check})")
        if self.references_engrams:
            parts.append("REFERENCES engrams(id) ON DELETE CASCADE")
        return " ".join(parts)

    @property
    def addable(self) -> bool:
        """Whether ALTER TABLE ADD COLUMN can add it to a table that has rows."""
        return not self.primary_key and not (self.not_null and self.default is None)


@dataclass(frozen=True)
class Table:
    """One ordinary table: columns in order, plus an optional composite primary key."""

    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] = ()

    def create_sql(self, *, name: str | None = None, extra: tuple[str, ...] = ()) -> str:
        """`CREATE TABLE IF NOT EXISTS` for this table (optionally renamed, with extra columns)."""
        lines = [column.definition() for column in self.columns]
        lines.extend(extra)
        if self.primary_key:
            lines.append(f"PRIMARY KEY ({', '.join(self.primary_key)})")
        body = ",\n    ".join(lines)
        return f"CREATE TABLE IF NOT EXISTS {name or self.name} (\n    {body}\n)"


@dataclass(frozen=True)
class Index:
    """One plain index."""

    name: str
    table: str
    columns: tuple[str, ...]

    def create_sql(self) -> str:
        """`CREATE INDEX IF NOT EXISTS` for this index."""
        return f"CREATE INDEX IF NOT EXISTS {self.name} ON {self.table}({', '.join(self.columns)})"


def _fk(name: str, *, not_null: bool = True, primary_key: bool = False) -> Column:
    return Column(name, "TEXT", not_null=not_null, primary_key=primary_key, references_engrams=True)


# VAULT §3 `engrams`, in the normative column order.
ENGRAMS: Final = Table(
    "engrams",
    (
        Column("id", "TEXT", primary_key=True),
        Column("layer", "TEXT", not_null=True, check=_in("layer", LAYERS)),
        Column(
            "source", "TEXT", not_null=True, default="'interaction'", check=_in("source", SOURCES)
        ),
        Column(
            "privacy_level",
            "TEXT",
            not_null=True,
            default="'cloud_first'",
            check=_in("privacy_level", PRIVACY_LEVELS),
        ),
        Column("content", "TEXT", not_null=True),
        Column("context", "TEXT", not_null=True),
        Column("strength", "REAL", not_null=True, default="1.0"),
        Column(
            "valence", "REAL", not_null=True, default="0.0", check="valence BETWEEN -1.0 AND 1.0"
        ),
        Column("retrievals", "INTEGER", not_null=True, default="0"),
        Column("imagined", "INTEGER", not_null=True, default="0"),
        Column("grounded", "INTEGER", not_null=True, default="0"),
        Column("created_at", "TEXT", not_null=True),
        Column("last_retrieved", "TEXT"),
        Column("project", "TEXT"),
        Column("tags", "TEXT"),
        Column("content_hash", "TEXT"),
        Column("scope", "TEXT", not_null=True, default="'moment'"),
        Column("content_type", "TEXT", not_null=True, default="'text'"),
        Column("occurred_at", "TEXT"),
        Column("modified_at", "TEXT"),
        Column("synced_at", "TEXT"),
        Column("agent_id", "TEXT"),
    ),
)

# VAULT §3 "Other tables", then the local-only sync_conflicts table (PROTOCOL §8).
OTHER_TABLES: Final = (
    Table(
        "engram_links",
        (
            _fk("source_id"),
            _fk("target_id"),
            Column("weight", "REAL", not_null=True, default="0.5"),
            Column("link_type", "TEXT", not_null=True, check=_in("link_type", LINK_TYPES)),
        ),
        primary_key=("source_id", "target_id"),
    ),
    Table(
        "engram_embeddings",
        (
            _fk("engram_id", not_null=False, primary_key=True),
            Column("embedding", "BLOB", not_null=True),
            Column("model", "TEXT", not_null=True, default="'all-MiniLM-L6-v2'"),
            Column("dimensions", "INTEGER", not_null=True, default="384"),
            Column("created_at", "TEXT", not_null=True),
        ),
    ),
    Table(
        "tombstones",
        (
            Column("id", "TEXT", primary_key=True),
            Column("deleted_at", "TEXT", not_null=True),
        ),
    ),
    Table(
        "access_events",
        (
            Column("id", "INTEGER", primary_key=True, autoincrement=True),
            Column("memory_id", "TEXT", not_null=True),  # no FK on purpose
            Column("op", "TEXT", not_null=True, check=_in("op", ACCESS_OPS)),
            Column("client", "TEXT", not_null=True, default="'http'"),
            Column("content_hash", "TEXT"),
            Column("at", "TEXT", not_null=True),
        ),
    ),
    Table(
        "coherence_state",
        (
            Column("id", "INTEGER", primary_key=True, default="1"),
            Column("baseline_valence", "REAL", not_null=True, default="0.3"),
            Column("character_strengths", "TEXT", not_null=True),
            Column("purpose_vector", "TEXT", not_null=True),
            Column("last_hygiene_daily", "TEXT"),
            Column("last_hygiene_weekly", "TEXT"),
            Column("drift_score", "REAL", default="0.0"),
            Column("updated_at", "TEXT", not_null=True),
        ),
    ),
    Table(
        "goals",
        (
            Column("id", "TEXT", primary_key=True),
            Column("description", "TEXT", not_null=True),
            Column("pathways", "TEXT", not_null=True),
            Column("agency_score", "REAL", default="0.5"),
            Column("created_at", "TEXT", not_null=True),
            Column("status", "TEXT", default="'active'", check=_in("status", GOAL_STATUSES)),
        ),
    ),
    Table(
        "consolidation_runs",
        (
            Column("id", "TEXT", primary_key=True),
            Column("run_at", "TEXT", not_null=True),
            Column("episodes_processed", "INTEGER"),
            Column("semantics_created", "INTEGER"),
            Column("engrams_decayed", "INTEGER"),
            Column("notes", "TEXT"),
        ),
    ),
    Table(
        "app_metrics",
        (
            Column("key", "TEXT", primary_key=True),
            Column("value", "INTEGER", not_null=True),
        ),
    ),
    Table(
        "memory_evidence",
        (
            _fk("memory_id"),
            _fk("evidence_id"),
            Column("relationship", "TEXT", not_null=True, default="'supports'"),
        ),
        primary_key=("memory_id", "evidence_id"),
    ),
    Table(
        "annotations",
        (
            Column("id", "TEXT", primary_key=True),
            _fk("memory_id"),
            Column("content", "TEXT", not_null=True),
            Column("created_at", "TEXT", not_null=True),
        ),
    ),
    Table(
        "saved_searches",
        (
            Column("id", "TEXT", primary_key=True),
            Column("query", "TEXT", not_null=True, default="''"),
            Column("layer", "TEXT"),
            Column("tags", "TEXT"),
            Column("notify", "INTEGER", not_null=True, default="0"),
            Column("created_at", "TEXT", not_null=True),
            Column("last_checked_at", "TEXT"),
        ),
    ),
    # PROTOCOL §8: local versions that lost to a remote version; never pushed.
    # No FK on memory_id: the row it saves may have been deleted by the remote tombstone.
    Table(
        "sync_conflicts",
        (
            Column("id", "INTEGER", primary_key=True, autoincrement=True),
            Column("memory_id", "TEXT", not_null=True),
            Column("local_plaintext", "TEXT", not_null=True),  # PROTOCOL §4 JSON
            Column("local_modified_at", "TEXT"),
            Column("remote_device_id", "TEXT", not_null=True),
            Column("remote_vector_clock", "INTEGER", not_null=True),
            Column("remote_deleted", "INTEGER", not_null=True, default="0"),
            Column("detected_at", "TEXT", not_null=True),
            Column("restored_at", "TEXT"),
        ),
    ),
)

TABLES: Final = (ENGRAMS, *OTHER_TABLES)

FTS_TABLE: Final = "engrams_fts"
FTS_CREATE_SQL: Final = "CREATE VIRTUAL TABLE IF NOT EXISTS engrams_fts USING fts5(id, content)"

INDEXES: Final = (
    Index("idx_engrams_layer", "engrams", ("layer",)),
    Index("idx_engrams_source", "engrams", ("source",)),
    Index("idx_engrams_created_at", "engrams", ("created_at",)),
    Index("idx_engrams_imagined", "engrams", ("imagined",)),
    Index("idx_engrams_content_hash", "engrams", ("content_hash",)),
    Index("idx_engrams_modified_at", "engrams", ("modified_at",)),
    Index("idx_engrams_agent_id", "engrams", ("agent_id",)),
    Index("idx_engram_links_source", "engram_links", ("source_id",)),
    Index("idx_engram_links_target", "engram_links", ("target_id",)),
    Index("idx_embeddings_created", "engram_embeddings", ("created_at",)),
    Index("idx_memory_evidence_memory", "memory_evidence", ("memory_id",)),
    Index("idx_memory_evidence_evidence", "memory_evidence", ("evidence_id",)),
    Index("idx_annotations_memory", "annotations", ("memory_id",)),
    Index("idx_access_events_at", "access_events", ("at",)),
    Index("idx_access_events_memory", "access_events", ("memory_id",)),
    Index("idx_sync_conflicts_memory", "sync_conflicts", ("memory_id",)),
)


# ---------------------------------------------------------------------------
# Applying the schema
# ---------------------------------------------------------------------------


def apply_schema(conn: sqlite3.Connection) -> None:
    """Bring an open, keyed vault connection to schema v10 (VAULT §3), idempotently.

    Creates missing tables, FTS table and indexes; adds columns an older vault
    lacks; rebuilds `engrams` when its `source` CHECK predates the v10 list
    (keeping rowids, so the FTS index stays aligned, and every other table's
    rows). One transaction; `user_version` is raised to 10 last. The connection
    must be in autocommit mode (`isolation_level=None`) and not in a transaction.
    """
    rebuild = _engrams_source_check_outdated(conn)
    fk_before = _pragma_int(conn, "foreign_keys")
    if rebuild and fk_before:
        # A no-op inside a transaction, so it is switched off before BEGIN: with
        # foreign keys on, dropping the old engrams table would cascade.
        conn.execute("PRAGMA foreign_keys = OFF")
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for table in TABLES:
                conn.execute(table.create_sql())
            added = _ensure_columns(conn)
            _backfill_added_columns(conn, added)
            if rebuild and _engrams_source_check_outdated(conn):
                _rebuild_engrams(conn)
                _check_foreign_keys(conn)
            _ensure_fts(conn)
            _ensure_indexes(conn)
            if _pragma_int(conn, "user_version") < SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        if rebuild and fk_before:
            conn.execute("PRAGMA foreign_keys = ON")


def _pragma_int(conn: sqlite3.Connection, name: str) -> int:
    row = conn.execute(f"PRAGMA {name}").fetchone()
    return int(row[0])


def _table_sql(conn: sqlite3.Connection, name: str) -> str | None:
    row = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return None if row is None else str(row[0])


def _column_names(conn: sqlite3.Connection, table: str) -> list[str]:
    return [str(row[1]) for row in conn.execute(f"PRAGMA table_info({table})")]


def _quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _ensure_columns(conn: sqlite3.Connection) -> set[tuple[str, str]]:
    """Add every column of the spec that an existing table lacks; return what was added."""
    added: set[tuple[str, str]] = set()
    for table in TABLES:
        present = set(_column_names(conn, table.name))
        for column in table.columns:
            if column.name in present:
                continue
            if not column.addable:
                raise VaultError(
                    f"the vault's {table.name} table has no {column.name} column and it"
                    " cannot be added: not an Engram vault this code can upgrade"
                )
            conn.execute(f"ALTER TABLE {table.name} ADD COLUMN {column.definition()}")
            added.add((table.name, column.name))
    return added


def _backfill_added_columns(conn: sqlite3.Connection, added: set[tuple[str, str]]) -> None:
    """Give rows of an upgraded vault meaningful values in the columns just added."""
    if ("engrams", "modified_at") in added:
        # Before the push cursor existed, a row was last modified when it was created.
        conn.execute("UPDATE engrams SET modified_at = created_at WHERE modified_at IS NULL")
    if ("engrams", "content_hash") in added:
        rows = conn.execute("SELECT rowid, content FROM engrams WHERE content_hash IS NULL")
        conn.executemany(
            "UPDATE engrams SET content_hash = ? WHERE rowid = ?",
            [(normalized_hash(str(content)), rowid) for rowid, content in rows.fetchall()],
        )


def _engrams_source_check_outdated(conn: sqlite3.Connection) -> bool:
    """Whether `engrams` exists and its declaration does not admit every v10 source."""
    sql = _table_sql(conn, "engrams")
    return sql is not None and any(f"'{source}'" not in sql for source in SOURCES)


_REBUILD_TABLE: Final = "engrams_v10_rebuild"


def _rebuild_engrams(conn: sqlite3.Connection) -> None:
    """Recreate `engrams` with the v10 declaration (SQLite's documented 12-step rebuild).

    Runs inside the schema transaction with foreign keys off. Rowids are copied
    so `engrams_fts` stays aligned; columns unknown to v10 are kept (by name and
    type); the table's own indexes and non-FTS triggers are recreated.
    """
    spec_names = {column.name for column in ENGRAMS.columns}
    extra_names: list[str] = []
    extra: list[str] = []
    for _cid, name, type_, _notnull, default, _pk in conn.execute("PRAGMA table_info(engrams)"):
        if name in spec_names:
            continue
        quoted = _quote_identifier(str(name))
        definition = f"{quoted} {type_}".rstrip()
        if default is not None:
            definition += f" DEFAULT {default}"
        extra_names.append(quoted)
        extra.append(definition)
    saved = [
        str(sql)
        for (sql,) in conn.execute(
            "SELECT sql FROM sqlite_master WHERE tbl_name = 'engrams' AND sql IS NOT NULL"
            " AND type IN ('index', 'trigger') AND sql NOT LIKE '%engrams_fts%'"
        )
    ]
    columns = ", ".join([column.name for column in ENGRAMS.columns] + extra_names)
    conn.execute(f"DROP TABLE IF EXISTS {_REBUILD_TABLE}")
    conn.execute(ENGRAMS.create_sql(name=_REBUILD_TABLE, extra=tuple(extra)))
    try:
        conn.execute(
            # Identifiers only: spec column names and quoted names read from table_info.
            f"INSERT INTO {_REBUILD_TABLE} (rowid, {columns}) SELECT rowid, {columns} FROM engrams"  # noqa: S608
        )
    except DatabaseError as exc:
        raise VaultError(
            f"cannot upgrade the engrams table to schema v{SCHEMA_VERSION}: {exc}"
        ) from exc
    conn.execute("DROP TABLE engrams")
    legacy_alter = _pragma_int(conn, "legacy_alter_table")
    # Legacy mode: the rename neither rewrites nor re-checks views and triggers
    # elsewhere that name `engrams` (they keep naming the rebuilt table).
    conn.execute("PRAGMA legacy_alter_table = ON")
    try:
        conn.execute(f"ALTER TABLE {_REBUILD_TABLE} RENAME TO engrams")
    finally:
        conn.execute(f"PRAGMA legacy_alter_table = {legacy_alter}")
    for sql in saved:
        conn.execute(sql)


def _check_foreign_keys(conn: sqlite3.Connection) -> None:
    """After a rebuild, refuse to commit if it broke any reference."""
    problem = conn.execute("PRAGMA foreign_key_check").fetchone()
    if problem is not None:
        raise VaultError(
            f"upgrading the engrams table would break a reference from {problem[0]}; "
            "the vault was left unchanged"
        )


def _normalized_sql(sql: str) -> str:
    return re.sub(r"\s+", "", sql).lower().replace("ifnotexists", "")


def _ensure_fts(conn: sqlite3.Connection) -> None:
    """`engrams_fts USING fts5(id, content)`, maintained by code, never by triggers."""
    for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'trigger' AND sql LIKE '%engrams_fts%'"
    ).fetchall():
        conn.execute(f"DROP TRIGGER {_quote_identifier(str(name))}")
    sql = _table_sql(conn, FTS_TABLE)
    if sql is not None and _normalized_sql(sql) == _normalized_sql(FTS_CREATE_SQL):
        return
    if sql is not None:
        # An older FTS layout (external content, other columns): rebuild it.
        conn.execute(f"DROP TABLE {FTS_TABLE}")
    conn.execute(FTS_CREATE_SQL)
    conn.execute(
        "INSERT INTO engrams_fts(rowid, id, content) SELECT rowid, id, content FROM engrams"
    )


def _index_columns(conn: sqlite3.Connection, table: str) -> dict[str, tuple[str, ...]]:
    """Every index of `table` with its column sequence."""
    found: dict[str, tuple[str, ...]] = {}
    for row in conn.execute(f"PRAGMA index_list({table})").fetchall():
        name = str(row[1])
        info = conn.execute(f"PRAGMA index_info({_quote_identifier(name)})").fetchall()
        found[name] = tuple(str(column[2]) for column in sorted(info))
    return found


def _ensure_indexes(conn: sqlite3.Connection) -> None:
    """Create each listed index unless one with that name or those columns exists."""
    for index in INDEXES:
        existing = _index_columns(conn, index.table)
        if index.name in existing or index.columns in existing.values():
            continue
        conn.execute(index.create_sql())
