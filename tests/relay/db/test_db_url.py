"""Database URL resolution precedence and URL helpers."""

from __future__ import annotations

import pytest

from engram_sync.relay.db.url import (
    redact_url,
    resolve_database_url,
    to_libpq_url,
    to_sqlalchemy_url,
)

EXPLICIT = "postgresql://explicit@db/relay"
RELAY_ENV = "postgresql://relay-env@db/relay"
GENERIC_ENV = "postgresql://generic@db/relay"


def test_explicit_wins_over_both_env_vars() -> None:
    env = {"ENGRAM_RELAY_DATABASE_URL": RELAY_ENV, "DATABASE_URL": GENERIC_ENV}
    assert resolve_database_url(EXPLICIT, env) == EXPLICIT


def test_relay_env_var_wins_over_database_url() -> None:
    env = {"ENGRAM_RELAY_DATABASE_URL": RELAY_ENV, "DATABASE_URL": GENERIC_ENV}
    assert resolve_database_url(None, env) == RELAY_ENV


def test_database_url_is_the_last_resort() -> None:
    assert resolve_database_url(None, {"DATABASE_URL": GENERIC_ENV}) == GENERIC_ENV


def test_nothing_set_means_embedded() -> None:
    assert resolve_database_url(None, {}) is None


def test_blank_values_count_as_unset() -> None:
    env = {"ENGRAM_RELAY_DATABASE_URL": "  ", "DATABASE_URL": GENERIC_ENV}
    assert resolve_database_url("", env) == GENERIC_ENV
    assert resolve_database_url(None, {"DATABASE_URL": ""}) is None


def test_reads_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGRAM_RELAY_DATABASE_URL", raising=False)
    monkeypatch.setenv("DATABASE_URL", GENERIC_ENV)
    assert resolve_database_url() == GENERIC_ENV
    monkeypatch.setenv("ENGRAM_RELAY_DATABASE_URL", RELAY_ENV)
    assert resolve_database_url() == RELAY_ENV
    assert resolve_database_url(EXPLICIT) == EXPLICIT


def test_redact_hides_passwords() -> None:
    assert redact_url("postgresql://u:s3cret@h:5432/d") == "postgresql://u:***@h:5432/d"
    assert redact_url("postgresql://u@h/d?password=s3cret&x=1") == (
        "postgresql://u@h/d?password=***&x=1"
    )
    assert redact_url("postgresql://u@h/d") == "postgresql://u@h/d"
    assert "p@ss" not in redact_url("postgresql://u:p@ss@h/d")


def test_driver_translation() -> None:
    assert to_sqlalchemy_url("postgresql://u@h/d") == "postgresql+psycopg://u@h/d"
    assert to_sqlalchemy_url("postgres://u@h/d") == "postgresql+psycopg://u@h/d"
    assert to_sqlalchemy_url("postgresql+asyncpg://u@h/d") == "postgresql+psycopg://u@h/d"
    assert to_libpq_url("postgresql+psycopg://u@h/d") == "postgresql://u@h/d"
    with pytest.raises(ValueError, match="not a PostgreSQL URL"):
        to_sqlalchemy_url("mysql://u:secret@h/d")
