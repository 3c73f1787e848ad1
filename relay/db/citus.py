"""Placing the relay's tables on Citus (distributed PostgreSQL), after the migrations.

Issue 18, deploy/SCALING.md "Citus": every vault-scoped table is distributed by
``vault_id`` and colocated with ``vaults``, so one vault lives on one shard and a push
or a pull is a single-shard (router) statement; the global lookups (keys, accounts,
sessions, pairing codes, ...) are reference tables, copied to every node. The lists
below are the decision; SCALING.md gives the reason for each.

``distribute(url)`` is idempotent: a table already placed is left alone, so running it
after every ``engram-relay migrate`` places exactly the tables a new migration created.
A table in neither list stops it (a new migration must decide), and so does a schema
Citus would refuse or that would break the one-vault-one-shard rule: a unique index of a
distributed table not led by ``vault_id``, or a foreign key from a distributed table to
another distributed one that does not join on ``vault_id`` (``check_schema``).

No HTTP here: ``relay.db.migrate.upgrade_to_head`` calls it (``engram-relay migrate
--citus``, or when the database has the citus extension).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.pool import NullPool

from engram_sync.relay.db.url import to_sqlalchemy_url

__all__ = [
    "COLOCATION_ANCHOR",
    "DISTRIBUTED_TABLES",
    "DISTRIBUTION_COLUMN",
    "REFERENCE_TABLES",
    "CitusError",
    "Placement",
    "check_schema",
    "distribute",
    "has_citus",
    "placements",
]

log = logging.getLogger(__name__)

DISTRIBUTION_COLUMN = "vault_id"
#: Distributed first; every other distributed table is colocated with it.
COLOCATION_ANCHOR = "vaults"
#: Hash-distributed by vault_id, colocated with vaults (order: the anchor first).
DISTRIBUTED_TABLES: tuple[str, ...] = (
    "vaults",
    "blobs",
    "devices",
    "quotas",
    "handoff_requests",
    "vault_owners",
    "vault_grants",
    "vault_passkey_wraps",  # 0019 (docs/web-vault.md): keyed by vault, under a vault key
)
#: Copied to every node: looked up without a vault id (or by account), small, rarely
#: written. Referenced tables before the tables whose foreign keys point at them.
REFERENCE_TABLES: tuple[str, ...] = (
    "accounts",
    "sessions",
    "account_wraps",
    "vault_wraps",
    "passkey_wraps",  # 0018 (docs/web-vault.md): keyed and read by account, as vault_wraps
    "api_keys",
    "pairing_codes",
    "idempotency_keys",
    "relay_meta",
    "relay_processes",  # issue 18: the heartbeats that share a key's rate (SCALING.md §1)
    "alembic_version",
)


class CitusError(RuntimeError):
    """The database cannot be placed on Citus as it is (the message says what to change)."""


@dataclass(frozen=True)
class Placement:
    """How Citus holds one table: ``hash`` (distributed) or ``reference``."""

    table: str
    method: str
    column: str | None
    colocation_id: int


@dataclass
class _Schema:
    tables: list[str]
    unique_indexes: list[tuple[str, str, str]] = field(default_factory=list)  # table, index, col1
    foreign_keys: list[tuple[str, str, str, list[str], list[str]]] = field(default_factory=list)


def has_citus(conn: Connection) -> bool:
    """Whether the database has the citus extension (then migrations also distribute)."""
    found = conn.execute(text("SELECT 1 FROM pg_extension WHERE extname = 'citus'"))
    return found.first() is not None


def _read_schema(conn: Connection) -> _Schema:
    tables = [
        row[0]
        for row in conn.execute(
            text(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') ORDER BY 1"
            )
        )
    ]
    schema = _Schema(tables)
    for table, index, first in conn.execute(
        text(
            """
            SELECT t.relname, i.relname, a.attname
            FROM pg_index x
            JOIN pg_class t ON t.oid = x.indrelid
            JOIN pg_class i ON i.oid = x.indexrelid
            JOIN pg_namespace n ON n.oid = t.relnamespace
            LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = x.indkey[0]
            WHERE n.nspname = 'public' AND x.indisunique
            """
        )
    ):
        schema.unique_indexes.append((table, index, first or "(expression)"))
    for name, table, target, columns, target_columns in conn.execute(
        text(
            """
            SELECT c.conname, t.relname, f.relname,
                   ARRAY(SELECT attname FROM unnest(c.conkey) WITH ORDINALITY k(n, o)
                         JOIN pg_attribute ON attrelid = c.conrelid AND attnum = k.n ORDER BY o),
                   ARRAY(SELECT attname FROM unnest(c.confkey) WITH ORDINALITY k(n, o)
                         JOIN pg_attribute ON attrelid = c.confrelid AND attnum = k.n ORDER BY o)
            FROM pg_constraint c
            JOIN pg_class t ON t.oid = c.conrelid
            JOIN pg_class f ON f.oid = c.confrelid
            JOIN pg_namespace n ON n.oid = t.relnamespace
            WHERE n.nspname = 'public' AND c.contype = 'f'
            """
        )
    ):
        schema.foreign_keys.append((name, table, target, list(columns), list(target_columns)))
    return schema


def _problems(schema: _Schema) -> list[str]:
    distributed, reference = set(DISTRIBUTED_TABLES), set(REFERENCE_TABLES)
    problems = [
        f"table {table} is neither distributed nor a reference table: add it to "
        "relay.db.citus (and deploy/SCALING.md)"
        for table in schema.tables
        if table not in distributed | reference
    ]
    for table, index, first in schema.unique_indexes:
        if table in distributed and first != DISTRIBUTION_COLUMN:
            problems.append(
                f"unique index {index} of {table} is led by {first}, not {DISTRIBUTION_COLUMN}"
            )
    for name, table, target, columns, target_columns in schema.foreign_keys:
        if table in reference and target in distributed:
            problems.append(f"foreign key {name}: reference table {table} -> distributed {target}")
        elif table in distributed and target in distributed:
            pairs = set(zip(columns, target_columns, strict=True))
            if (DISTRIBUTION_COLUMN, DISTRIBUTION_COLUMN) not in pairs:
                problems.append(
                    f"foreign key {name} of {table} -> {target} does not join on "
                    f"{DISTRIBUTION_COLUMN}: it would cross vaults"
                )
    return problems


def check_schema(conn: Connection) -> list[str]:
    """What stops the schema from being placed (empty when it can be): see the docstring."""
    return _problems(_read_schema(conn))


def placements(conn: Connection) -> dict[str, Placement]:
    """The tables Citus holds (``pg_dist_partition``), by name."""
    rows = conn.execute(
        text(
            """
            SELECT logicalrelid::regclass::text,
                   CASE partmethod WHEN 'h' THEN 'hash' WHEN 'n' THEN 'reference'
                                   ELSE partmethod::text END,
                   column_to_column_name(logicalrelid, partkey), colocationid
            FROM pg_dist_partition
            """
        )
    )
    return {row[0]: Placement(row[0], row[1], row[2], int(row[3])) for row in rows}


def _execute_each(conn: Connection, statements: Sequence[str]) -> None:
    # One statement per call: Citus refuses several DDL commands in one query string.
    for statement in statements:
        conn.execute(text(statement))


def distribute(database_url: str, *, create_extension: bool = False) -> list[str]:
    """Place every table (see the module docstring); return the tables placed now."""
    engine = create_engine(
        to_sqlalchemy_url(database_url), poolclass=NullPool, isolation_level="AUTOCOMMIT"
    )
    try:
        with engine.connect() as conn:
            if create_extension:
                _create_extension(conn)
            elif not has_citus(conn):
                raise CitusError(
                    "the database has no citus extension: run `CREATE EXTENSION citus` as a "
                    "superuser (citus in shared_preload_libraries), or migrate with --citus"
                )
            problems = check_schema(conn)
            if problems:
                raise CitusError("cannot distribute the relay's tables: " + "; ".join(problems))
            return _place(conn)
    finally:
        engine.dispose()


def _create_extension(conn: Connection) -> None:
    available = conn.execute(
        text("SELECT 1 FROM pg_available_extensions WHERE name = 'citus'")
    ).first()
    if available is None:
        raise CitusError(
            "--citus: the citus extension is not installed on this PostgreSQL server "
            "(install Citus and add citus to shared_preload_libraries)"
        )
    conn.execute(text("CREATE EXTENSION IF NOT EXISTS citus"))


def _place(conn: Connection) -> list[str]:
    existing = set(_read_schema(conn).tables)
    placed = placements(conn)
    done: list[str] = []
    for table in REFERENCE_TABLES:
        if table in existing and table not in placed:
            conn.execute(text("SELECT create_reference_table(:t)"), {"t": table})
            done.append(table)
    for table in DISTRIBUTED_TABLES:
        if table not in existing or table in placed:
            continue
        if table == COLOCATION_ANCHOR:
            conn.execute(
                text("SELECT create_distributed_table(:t, :c)"),
                {"t": table, "c": DISTRIBUTION_COLUMN},
            )
        else:
            conn.execute(
                text("SELECT create_distributed_table(:t, :c, colocate_with => :a)"),
                {"t": table, "c": DISTRIBUTION_COLUMN, "a": COLOCATION_ANCHOR},
            )
        done.append(table)
    # Rows a table held before it was placed were copied to its shards; the coordinator's
    # local copy is invisible from now on, and only takes space.
    _execute_each(
        conn, [f"SELECT truncate_local_data_after_distributing_table('{t}')" for t in done]
    )
    if done:
        log.info("citus: placed tables %s", ", ".join(done), extra={"tables": done})
    return done
