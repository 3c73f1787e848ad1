"""The asyncpg pool helper."""

from __future__ import annotations

import asyncio

from relay.db.pool import create_pool


def test_pool_sessions_are_utc_and_tagged(fresh_database_url: str) -> None:
    async def scenario() -> tuple[str, str, int]:
        pool = await create_pool(fresh_database_url, min_size=1, max_size=2)
        try:
            async with pool.acquire() as conn:
                tz = await conn.fetchval("SHOW timezone")
                app = await conn.fetchval("SHOW application_name")
                n = await conn.fetchval("SELECT count(*) FROM vaults")
                return tz, app, n
        finally:
            await pool.close()

    assert asyncio.run(scenario()) == ("UTC", "engram-relay", 0)


def test_released_connections_are_rolled_back_without_a_reset_round_trip(
    fresh_database_url: str,
) -> None:
    """A transaction left open is rolled back on release (asyncpg does that), but the
    session is not reset (`RESET ALL` …): the relay leaves no session state to reset, and
    that query would cost a round trip per request."""

    async def scenario() -> tuple[str, bool, int]:
        pool = await create_pool(fresh_database_url, min_size=1, max_size=1)
        try:
            async with pool.acquire() as conn:
                await conn.execute("SET statement_timeout = '1234ms'")  # session state
                await conn.execute("BEGIN")
                await conn.execute("INSERT INTO vaults (vault_id) VALUES ('left-open')")
            async with pool.acquire() as conn:  # the one connection of the pool again
                timeout = await conn.fetchval("SHOW statement_timeout")
                in_transaction = conn.is_in_transaction()
                rows = await conn.fetchval("SELECT count(*) FROM vaults")
                return timeout, in_transaction, rows
        finally:
            await pool.close()

    timeout, in_transaction, rows = asyncio.run(scenario())
    assert timeout == "1234ms"  # not reset: no RESET ALL was sent
    assert not in_transaction
    assert rows == 0  # the open transaction was rolled back
