"""A transaction whose BEGIN travels with its first statement: one round trip fewer.

asyncpg's `Connection.transaction()` sends BEGIN alone and waits for its answer. A
statement without parameters can go with it in one simple-query message ("BEGIN; ...";
PostgreSQL runs both and answers once), so a short transaction whose first statement is
a constant (a `SET LOCAL`) or a row lock on a key spelled in hex (`hex_text`) costs one
round trip less (issue 36: the push's round trips, the pull progress's own transaction).
COMMIT (or ROLLBACK on any error) ends it when the block is left.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg


def hex_text(value: str) -> str:
    """`value` as a SQL text expression built of hex digits only (no quote, no backslash,
    whatever the string holds or the server's `standard_conforming_strings`), for the one
    place a key must go into a statement without parameters (`begun`'s first statement)."""
    return f"convert_from(decode('{value.encode().hex()}', 'hex'), 'UTF8')"


@contextlib.asynccontextmanager
async def begun(conn: asyncpg.Connection, first: str) -> AsyncIterator[str]:
    """BEGIN and `first` (constants only: no parameters) in one round trip; yields
    `first`'s command status ("SELECT 1", "SET"). COMMIT when the block ends, ROLLBACK when
    it raises (the error raised is the block's)."""
    try:
        # `first` failing leaves the transaction open and aborted: rolled back below too
        status = await conn.execute(f"BEGIN; {first}")
        yield status
    except BaseException:
        # A broken or cancelled connection cannot roll back; the pool then rolls back or
        # drops it (asyncpg resets a released connection left in a transaction).
        with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
            await conn.execute("ROLLBACK")
        raise
    await conn.execute("COMMIT")
