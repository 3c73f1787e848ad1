"""A transaction whose BEGIN travels with its first statement, and whose COMMIT travels with
its last: two round trips fewer than asyncpg's `Connection.transaction()`.

asyncpg sends BEGIN and COMMIT alone and waits for each answer. Statements without
parameters can go with them in one simple-query message ("BEGIN; ...", "...; COMMIT";
PostgreSQL runs them in order and answers once), so a short transaction whose first and
last statements are constants costs two round trips less (issue 36: the push's round
trips, the pull progress's own transaction). Such statements hold no request text: only
numbers and keys spelled in hex (`hex_text`, `hex_bytea`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg


def hex_text(value: str) -> str:
    """`value` as a SQL text expression built of hex digits only (no quote, no backslash,
    whatever the string holds or the server's `standard_conforming_strings`), for a key
    that must go into a statement without parameters."""
    return f"convert_from(decode('{value.encode().hex()}', 'hex'), 'UTF8')"


def hex_bytea(value: bytes) -> str:
    """`value` as a SQL bytea expression built of hex digits only (as `hex_text`)."""
    return f"decode('{value.hex()}', 'hex')"


@dataclass
class Begun:
    """An open transaction of `begun`: the status of its first statement, and the
    statements the block asks to send with COMMIT (constants only, in order)."""

    status: str
    with_commit: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def begun(conn: asyncpg.Connection, first: str) -> AsyncIterator[Begun]:
    """BEGIN and `first` (constants only: no parameters) in one round trip; yields a
    `Begun` with `first`'s command status ("SELECT 1", "SET"). When the block ends, its
    `with_commit` statements and COMMIT in one round trip; ROLLBACK when anything raises
    (the error raised is the block's or the statements')."""
    try:
        # `first` failing leaves the transaction open and aborted: rolled back below too
        done = Begun(await conn.execute(f"BEGIN; {first}"))
        yield done
        # a statement failing here skips COMMIT: rolled back below
        await conn.execute("; ".join([*done.with_commit, "COMMIT"]))
    except BaseException:
        # A broken or cancelled connection cannot roll back; the pool then rolls back or
        # drops it (asyncpg resets a released connection left in a transaction).
        with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
            await conn.execute("ROLLBACK")
        raise
