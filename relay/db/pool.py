"""The relay's asyncpg connection pool."""

from __future__ import annotations

import logging

import asyncpg

from engram_sync.relay.db.url import redact_url, to_libpq_url

__all__ = ["create_pool"]

log = logging.getLogger(__name__)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Releasing a connection skips asyncpg's default reset query (`pg_advisory_unlock_all();
    CLOSE ALL; UNLISTEN *; RESET ALL`), one more round trip on every request.

    The relay never leaves session state behind: no SET, no LISTEN, no cursors outside a
    transaction, advisory locks only transaction-scoped (`pg_advisory_xact_lock`). asyncpg
    still rolls back a transaction left open before it calls this.
    """


async def create_pool(database_url: str, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    """Open an asyncpg pool on ``database_url``.

    Sessions run in UTC and are tagged ``application_name=engram-relay``; no
    custom codecs are registered (the schema has no JSON or custom types).
    ``min_size`` is clamped to ``max_size``: `ENGRAM_RELAY_POOL_SIZE=1` sets only the
    maximum, and asyncpg refuses a minimum above it (issue 14 item 15).
    """
    if max_size < 1:
        raise ValueError(f"the database pool needs at least 1 connection, got {max_size}")
    min_size = min(min_size, max_size)
    pool = await asyncpg.create_pool(
        to_libpq_url(database_url),
        min_size=min_size,
        max_size=max_size,
        server_settings={"application_name": "engram-relay", "timezone": "UTC"},
        reset=_keep_session,
    )
    log.info(
        "database pool open url=%s min_size=%d max_size=%d",
        redact_url(database_url),
        min_size,
        max_size,
        extra={"url": redact_url(database_url), "min_size": min_size, "max_size": max_size},
    )
    return pool
