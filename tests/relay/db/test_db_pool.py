"""The asyncpg pool helper."""

from __future__ import annotations

import asyncio

from engram_sync.relay.db.pool import create_pool


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


def test_a_pool_size_of_one_clamps_the_minimum_and_the_relay_serves(
    fresh_database_url: str,
) -> None:
    """`ENGRAM_RELAY_POOL_SIZE=1` sets the maximum only; the default minimum of 2 crashed
    start-up (asyncpg: min_size greater than max_size). The minimum is clamped now."""
    import httpx

    from engram_sync.relay.services.config import config_from_env
    from tests.relay.conftest import ADMIN_KEY, RelayThread
    from tests.relay.support import Sealer, pull_ok, push

    env = {"ENGRAM_RELAY_POOL_SIZE": "1", "SYNC_API_KEYS": f"{ADMIN_KEY}:100000"}
    config = config_from_env(fresh_database_url, env=env)
    assert (config.pool_min_size, config.pool_max_size) == (2, 1)  # as configured
    server = RelayThread(config).start()
    try:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
            assert http.get("/ready").status_code == 200
            assert push(http, "one-conn", [Sealer("one-conn").blob("m", 1)]).status_code == 200
            assert pull_ok(http, "one-conn", cursor=0)["cursor"] == 1
    finally:
        server.stop()

    async def size() -> tuple[int, int]:
        pool = await create_pool(fresh_database_url, min_size=2, max_size=1)
        try:
            return pool.get_min_size(), pool.get_max_size()
        finally:
            await pool.close()

    assert asyncio.run(size()) == (1, 1)
