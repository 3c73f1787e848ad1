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
