"""The relay-process heartbeats (relay.store.replicas, issue 18) on a real PostgreSQL:
a heartbeat counts for 3 of its writer's periods by the database clock, a clean leave
removes the row at once and forgets rows that expired long ago."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.store.replicas import Replica, heartbeat, leave


def test_heartbeats_expire_after_three_periods_and_leave_removes_the_row(
    fresh_database_url: str,
) -> None:
    async def go() -> list[int]:
        conn = await asyncpg.connect(to_libpq_url(fresh_database_url))
        try:
            short, long = Replica(0.5), Replica(3600.0)
            counts = [await heartbeat(conn, short), await heartbeat(conn, long)]
            await asyncio.sleep(2.0)  # past the short one's 1.5 s: it expired
            counts.append(await heartbeat(conn, long))
            counts.append(await heartbeat(conn, short))  # it beats again: counted again
            await leave(conn, short)
            counts.append(await heartbeat(conn, long))  # the positive case: alone
            return counts
        finally:
            await conn.close()

    started = time.monotonic()
    counts = asyncio.run(go())
    assert counts[0] == 1
    assert counts[2:] == [1, 2, 1], counts
    # the first two: 2 unless the machine stalled past 1.5 s between them
    assert counts[1] == 2 or time.monotonic() - started > 1.5, counts


def test_leave_forgets_rows_that_expired_long_ago_and_keeps_recent_ones(
    fresh_database_url: str,
) -> None:
    async def go() -> list[str]:
        conn = await asyncpg.connect(to_libpq_url(fresh_database_url))
        try:
            await conn.execute(
                "INSERT INTO relay_processes (process_id, expires_at) VALUES"
                " ('crashed-long-ago', now() - interval '2 hours'),"
                " ('crashed-just-now', now() - interval '1 minute')"
            )
            me = Replica(10.0)
            assert await heartbeat(conn, me) == 1  # expired rows never count
            await leave(conn, me)
            rows = await conn.fetch("SELECT process_id FROM relay_processes ORDER BY 1")
            return [row["process_id"] for row in rows]
        finally:
            await conn.close()

    assert asyncio.run(go()) == ["crashed-just-now"]
