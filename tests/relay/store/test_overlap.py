"""relay.store.overlap.while_answered: the work runs while the statement is in flight.

Against a real PostgreSQL: the work itself asks the server (from another thread and
connection) which statements are running, and sees the push's statement among them;
no timing is asserted.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

import asyncpg
import pytest

from engram_sync.relay.store.overlap import while_answered

_MARK = "engram-overlap-test"
_RUNNING = (
    "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE $1"
    " AND pid <> pg_backend_pid()"
)


def running_elsewhere(url: str, marker: str) -> int:
    """How many statements containing `marker` the server runs right now (asked from a
    thread of its own: the caller's event loop is busy with the caller)."""
    found: list[int] = []

    async def ask() -> None:
        conn = await asyncpg.connect(url)
        try:
            found.append(await conn.fetchval(_RUNNING, f"%{marker}%"))
        finally:
            await conn.close()

    thread = threading.Thread(target=lambda: asyncio.run(ask()))
    thread.start()
    thread.join()
    return found[0]


async def _in_flight(url: str, statement: Coroutine[Any, Any, object]) -> tuple[object, int]:
    return await while_answered(statement, lambda: running_elsewhere(url, _MARK))


def test_the_work_runs_while_the_database_runs_the_statement(fresh_database_url: str) -> None:
    async def main() -> tuple[tuple[object, int], int]:
        conn = await asyncpg.connect(fresh_database_url)
        try:
            overlapped = await _in_flight(
                fresh_database_url,
                conn.fetchval(f"SELECT '{_MARK}', pg_sleep(1) IS NULL AS slept"),
            )
            # The positive case's counterpart: the statement awaited first, then the work:
            # nothing of it runs any more.
            await conn.fetchval(f"SELECT '{_MARK}', pg_sleep(0.1)")
            after = running_elsewhere(fresh_database_url, _MARK)
            return overlapped, after
        finally:
            await conn.close()

    (answer, seen), after = asyncio.run(main())
    assert answer == _MARK  # the statement's answer comes back
    assert seen == 1  # it was running while the work ran
    assert after == 0


def test_executemany_and_fetchmany_are_sent_before_the_work(fresh_database_url: str) -> None:
    async def main() -> list[int]:
        conn = await asyncpg.connect(fresh_database_url)
        try:
            seen = []
            for send in (conn.executemany, conn.fetchmany):
                sql = f"SELECT '{_MARK}', pg_sleep($1)"
                _, running = await _in_flight(fresh_database_url, send(sql, [(0.5,), (0.1,)]))
                seen.append(running)
            return seen
        finally:
            await conn.close()

    assert asyncio.run(main()) == [1, 1]


def test_a_failing_work_waits_for_the_statement_and_raises_its_own_error(
    fresh_database_url: str,
) -> None:
    def work() -> None:
        raise ValueError("the work failed")

    async def main() -> int:
        conn = await asyncpg.connect(fresh_database_url)
        try:
            with pytest.raises(ValueError, match="the work failed"):
                await while_answered(conn.fetchval("SELECT pg_sleep(0.2)"), work)
            # The connection has no operation in flight: the next statement runs.
            value: int = await conn.fetchval("SELECT 41 + 1")
            return value
        finally:
            await conn.close()

    assert asyncio.run(main()) == 42


def test_a_failing_statement_raises_after_the_work_ran(fresh_database_url: str) -> None:
    ran: list[str] = []

    async def main() -> None:
        conn = await asyncpg.connect(fresh_database_url)
        try:
            with pytest.raises(asyncpg.UndefinedTableError):
                await while_answered(
                    conn.fetch("SELECT * FROM no_such_table"), lambda: ran.append("work")
                )
            assert await conn.fetchval("SELECT 1") == 1
        finally:
            await conn.close()

    asyncio.run(main())
    assert ran == ["work"]
