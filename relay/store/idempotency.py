"""The `idempotency_keys` table (migration 0007; relay/domain/idempotency_keys.py says what is
stored).

`claim` runs first in the transaction of the work it guards: the row's primary key makes a
concurrent repeat wait for that transaction, and then either find the row (the first one
committed: replay its answer) or take over (the first one rolled back). The row becomes
visible with its answer in the same commit as the work, so no half-done state is ever seen.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

import asyncpg

from engram_sync.relay.domain.idempotency_keys import IdempotentRequest

TTL: Final = timedelta(hours=24)
_PENDING: Final = b""  # the answer until `remember` stores it, in the same transaction


async def recall(db: asyncpg.Pool | asyncpg.Connection, request: IdempotentRequest) -> bytes | None:
    """The first answer to this request, if one committed and has not expired."""
    row = await db.fetchrow(
        "SELECT request_mac, answer FROM idempotency_keys WHERE lookup = $1 AND expires_at > now()",
        request.lookup,
    )
    if row is None:
        return None
    return request.open(bytes(row["request_mac"]), bytes(row["answer"]))


async def claim(conn: asyncpg.Connection, request: IdempotentRequest) -> bool:
    """Take the key for this transaction; False when another request's row holds it.

    An expired row is taken over (its 24 hours are up), as if it had been purged.
    `excluded.created_at` is the inserted row's default, now(): Citus refuses now()
    itself in ON CONFLICT's SET and WHERE (deploy/SCALING.md §3).
    """
    taken = await conn.fetchval(
        "INSERT INTO idempotency_keys (lookup, request_mac, answer, expires_at)"
        " VALUES ($1, $2, $3, now() + $4)"
        " ON CONFLICT (lookup) DO UPDATE SET request_mac = excluded.request_mac,"
        "   answer = excluded.answer, created_at = excluded.created_at,"
        "   expires_at = excluded.expires_at"
        "   WHERE idempotency_keys.expires_at <= excluded.created_at"
        " RETURNING true",
        request.lookup,
        request.request_mac,
        _PENDING,
        TTL,
    )
    return bool(taken)


async def remember(conn: asyncpg.Connection, request: IdempotentRequest, answer: bytes) -> None:
    """Store the answer on the row `claim` took, in the same transaction."""
    await conn.execute(
        "UPDATE idempotency_keys SET answer = $2 WHERE lookup = $1",
        request.lookup,
        request.seal(answer),
    )


async def release(conn: asyncpg.Connection, request: IdempotentRequest) -> None:
    """Give the key back in the transaction that claimed it: the work made nothing."""
    await conn.execute("DELETE FROM idempotency_keys WHERE lookup = $1", request.lookup)


async def purge_expired_keys(conn: asyncpg.Connection) -> int:
    """Delete rows past their 24 hours; how many (relay.services.maintenance runs it)."""
    status = await conn.execute("DELETE FROM idempotency_keys WHERE expires_at <= now()")
    return int(status.split()[-1])
