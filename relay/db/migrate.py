"""Schema migrations (alembic), run programmatically.

The migration scripts live in the top-level ``alembic/`` (``env.py``, ``versions/``), linked as
``relay/migrations/`` so they ship inside the package: an installed wheel migrates as a
checkout does.
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from engram_sync.relay.db import citus
from engram_sync.relay.db.url import redact_url, to_sqlalchemy_url

__all__ = [
    "MigrationsNotFoundError",
    "alembic_config",
    "alembic_dir",
    "current_revision",
    "head_revision",
    "upgrade_to_head",
]

log = logging.getLogger(__name__)

#: Advisory lock key held while migrating (an arbitrary constant: "engram01").
_MIGRATION_LOCK = 0x656E6772616D3031
#: Key of ``Config.attributes`` that ``relay/migrations/env.py`` reads the URL from.
DATABASE_URL_ATTRIBUTE = "database_url"


class MigrationsNotFoundError(RuntimeError):
    """The ``relay/migrations/`` directory with the migration scripts is missing."""


def alembic_dir() -> Path:
    """Return the relay's migration scripts directory (``relay/migrations``)."""
    path = Path(__file__).resolve().parents[1] / "migrations"
    if not (path / "env.py").is_file():
        raise MigrationsNotFoundError(
            f"migration scripts not found at {path}: the installation is incomplete; "
            "reinstall engram-sync[relay]"
        )
    return path


def alembic_config(database_url: str) -> Config:
    """Build an alembic ``Config`` for ``database_url`` (no ini file, no logging setup)."""
    config = Config()
    config.set_main_option("script_location", str(alembic_dir()))
    config.attributes[DATABASE_URL_ATTRIBUTE] = database_url
    return config


def head_revision() -> str:
    """Return the newest revision of the migration scripts."""
    script = ScriptDirectory(str(alembic_dir()))
    head = script.get_current_head()
    if head is None:
        raise MigrationsNotFoundError(f"no migration revisions in {alembic_dir()}")
    return head


def upgrade_to_head(database_url: str, *, citus_mode: bool = False) -> None:
    """Apply every pending migration to ``database_url`` (a no-op when up to date).

    On Citus (``citus_mode``: create the extension if missing; or detected: the database
    has the citus extension) the tables are then placed by ``relay.db.citus.distribute``,
    under the same lock (issue 18, deploy/SCALING.md).
    """
    log.info(
        "migrating database url=%s",
        redact_url(database_url),
        extra={"url": redact_url(database_url)},
    )
    # Replicas starting together must not run the same migration twice: hold a session
    # advisory lock on a connection of its own while alembic runs on another one.
    engine = create_engine(to_sqlalchemy_url(database_url), poolclass=NullPool)
    try:
        with engine.connect() as lock_connection:
            lock_connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _MIGRATION_LOCK})
            try:
                command.upgrade(alembic_config(database_url), "head")
                if citus_mode or citus.has_citus(lock_connection):
                    citus.distribute(database_url, create_extension=citus_mode)
            finally:
                lock_connection.execute(
                    text("SELECT pg_advisory_unlock(:key)"), {"key": _MIGRATION_LOCK}
                )
    finally:
        engine.dispose()


def current_revision(database_url: str) -> str | None:
    """Return the database's alembic revision, or ``None`` if it was never migrated."""
    engine = create_engine(to_sqlalchemy_url(database_url), poolclass=NullPool)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
