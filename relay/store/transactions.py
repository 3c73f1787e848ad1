"""One way to run store code in a transaction, whether the caller holds a pool or is already
inside a transaction on a connection (then the store's work joins it, as a savepoint)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeAlias

import asyncpg

#: What a store function that writes accepts: a pool, or a connection in a transaction.
Database: TypeAlias = asyncpg.Pool | asyncpg.Connection


@asynccontextmanager
async def transaction(db: Database) -> AsyncIterator[asyncpg.Connection]:
    """A connection in a transaction: a pooled one of its own, or `db`'s (a savepoint)."""
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn, conn.transaction():
            yield conn
    else:
        async with db.transaction():
            yield db
