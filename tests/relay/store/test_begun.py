"""relay.store.begun on real PostgreSQL: BEGIN with the first statement in one round trip,
a key spelled in hex whatever it holds, COMMIT at the end and ROLLBACK on an error; and the
pull progress's transaction (`relay.store.sync.record_progress`) committed unflushed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import pytest

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.store.begun import begun, hex_bytea, hex_text
from engram_sync.relay.store.sync import record_progress

T = TypeVar("T")
HOSTILE = ["plain", "it's", "back\\slash'; DROP TABLE vaults; --", "日本語 ü", '$$ $x$ "q"']


def run(url: str, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    async def main() -> T:
        conn = await asyncpg.connect(to_libpq_url(url))
        try:
            return await work(conn)
        finally:
            await conn.close()

    return asyncio.run(main())


def test_hex_text_is_the_string_whatever_it_holds(fresh_database_url: str) -> None:
    async def work(conn: asyncpg.Connection) -> tuple[list[str], list[bytes]]:
        texts = [await conn.fetchval(f"SELECT {hex_text(value)}") for value in HOSTILE]
        raw = [await conn.fetchval(f"SELECT {hex_bytea(v.encode())}") for v in HOSTILE]
        return texts, raw

    assert run(fresh_database_url, work) == (HOSTILE, [v.encode() for v in HOSTILE])


def test_begun_commits_in_one_transaction_and_rolls_back_on_error(
    fresh_database_url: str,
) -> None:
    async def work(conn: asyncpg.Connection) -> tuple[str, list[str]]:
        async with begun(conn, f"SELECT 1 FROM vaults WHERE vault_id = {hex_text('none')}") as tx:
            status = tx.status
            assert conn.is_in_transaction()
            await conn.execute("INSERT INTO vaults (vault_id) VALUES ('kept')")
            tx.with_commit.append(  # sent with COMMIT, in the same transaction
                f"UPDATE vaults SET digest = {hex_bytea(bytes(range(32)))} WHERE vault_id = 'kept'"
            )
        assert not conn.is_in_transaction()
        assert await conn.fetchval("SELECT digest FROM vaults") == bytes(range(32))

        async def failing_with_commit() -> None:
            async with begun(conn, "SELECT 1") as tx:
                await conn.execute("INSERT INTO vaults (vault_id) VALUES ('undone too')")
                tx.with_commit.append("SELECT 1 FROM no_such_table")

        with pytest.raises(asyncpg.UndefinedTableError):  # COMMIT skipped, rolled back
            await failing_with_commit()
        assert not conn.is_in_transaction()

        async def undone() -> None:
            async with begun(conn, "SET LOCAL synchronous_commit = off"):
                await conn.execute("INSERT INTO vaults (vault_id) VALUES ('undone')")
                await conn.execute("INSERT INTO vaults (vault_id) VALUES ('kept')")

        with pytest.raises(asyncpg.UniqueViolationError):
            await undone()
        assert not conn.is_in_transaction()
        with pytest.raises(asyncpg.UndefinedTableError):  # the first statement's own error
            async with begun(conn, "SELECT 1 FROM no_such_table"):
                pass
        assert not conn.is_in_transaction()
        rows = await conn.fetch("SELECT vault_id FROM vaults ORDER BY vault_id")
        return status, [r["vault_id"] for r in rows]

    assert run(fresh_database_url, work) == ("SELECT 0", ["kept"])


def test_pull_progress_commits_without_waiting_for_the_flush(fresh_database_url: str) -> None:
    """Issue 36: the progress write's transaction runs with synchronous_commit off (seen from
    inside it, by a trigger recording the setting), and the session keeps its own setting."""

    async def work(conn: asyncpg.Connection) -> tuple[list[str], str]:
        await conn.execute("INSERT INTO vaults (vault_id) VALUES ('v')")
        await conn.execute(
            """
            CREATE TABLE seen_setting (value text);
            CREATE FUNCTION note_setting() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO seen_setting VALUES (current_setting('synchronous_commit'));
                RETURN NEW;
            END $$;
            CREATE TRIGGER note BEFORE INSERT OR UPDATE ON devices
                FOR EACH ROW EXECUTE FUNCTION note_setting();
            SET synchronous_commit = on;
            """
        )
        await record_progress(conn, "v", "d", 3)
        await record_progress(conn, "v", "d", 5)
        # one value a trigger firing (the second write fires BEFORE INSERT and BEFORE UPDATE)
        seen = sorted({r["value"] for r in await conn.fetch("SELECT value FROM seen_setting")})
        cursor = await conn.fetchval("SELECT pulled_cursor FROM devices WHERE device_id = 'd'")
        assert cursor == 5
        return seen, await conn.fetchval("SHOW synchronous_commit")

    assert run(fresh_database_url, work) == (["off"], "on")
