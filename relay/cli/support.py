"""What every `engram-relay` command module shares: the one-line error and a database turn.

`relay.cli.main.main` catches CliError: one line on stderr, exit code 2, no traceback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import asyncpg

from engram_sync.relay.db.runtime import database
from engram_sync.relay.db.url import to_libpq_url
from engram_sync.shared_format.ids import check_id

T = TypeVar("T")


class CliError(Exception):
    """A failure to report in one line, with what to do."""


async def on_connection(url: str, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    """Run `work` on one new connection to `url`, closed afterwards."""
    conn = await asyncpg.connect(to_libpq_url(url))
    try:
        return await work(conn)
    finally:
        await conn.close()


def run_db(
    database_url: str | None,
    data_dir: Path | None,
    work: Callable[[asyncpg.Connection], Awaitable[T]],
) -> T:
    """Run `work` on one connection to the relay's (migrated) database."""
    with database(database_url, data_dir, migrate=True) as url:
        return asyncio.run(on_connection(url, work))


def check_vault(vault_id: str) -> str:
    """The vault id, or CliError saying what is wrong with it."""
    problem = check_id(vault_id, "vault id")
    if problem:
        raise CliError(problem)
    return vault_id
