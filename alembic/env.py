"""Alembic environment for the relay schema (raw SQL migrations, no ORM metadata)."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from engram_sync.relay.db.url import resolve_database_url, to_sqlalchemy_url

config = context.config

# Only the `alembic` command line has an ini file; programmatic runs
# (relay.db.migrate) leave logging to the application.
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _database_url() -> str:
    url = (
        config.attributes.get("database_url")
        or context.get_x_argument(as_dictionary=True).get("database_url")
        or resolve_database_url()
    )
    if not url:
        raise RuntimeError(
            "no database URL for migrations: pass -x database_url=postgresql://..., "
            "or set ENGRAM_RELAY_DATABASE_URL or DATABASE_URL"
        )
    return to_sqlalchemy_url(str(url))


def run_migrations_offline() -> None:
    """Emit the migration SQL instead of running it (``alembic upgrade head --sql``)."""
    context.configure(url=_database_url(), literal_binds=True, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on a live connection, one transaction per revision."""
    engine = create_engine(_database_url(), poolclass=NullPool)
    try:
        with engine.connect() as connection:
            context.configure(connection=connection, transaction_per_migration=True)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
