"""Round trips of a cursor pull's page (issue 36), counted on a real PostgreSQL as
tests/relay/store/test_push_round_trips.py counts a push's: every statement the page's
connection sends is one round trip (asyncpg's query logger).

Plain PostgreSQL (`at_once`): the page and the progress write, 2, whether the device is the
key's own or named by a header (its bound-key check travels in the progress statement);
the shape Citus keeps: the page, the bound-key check, BEGIN with the SET, the write, COMMIT
(5). And the one-round-trip progress write keeps `progress_device`'s rule (PROTOCOL §12,
docs/pull-progress.md): a header never records progress for a device bound to a key of the
vault, ids spelled in hex whatever they hold."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from engram_sync.relay.db.pool import create_pool
from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.store.sync import pull_by_cursor, record_progress_at_once
from engram_sync.shared_format.wire import SyncBlob
from tests.conftest import backend_of
from tests.relay.support import new_vault_id

pytestmark = pytest.mark.both_databases
HOSTILE = ["it's", "back\\slash'; DROP TABLE vaults; --", "日本語 ü", '$$ $x$ "q"']


async def _vault_with_blobs(conn: asyncpg.Connection, vault_id: str) -> None:
    await conn.execute("INSERT INTO vaults (vault_id, seq) VALUES ($1, 3)", vault_id)
    for seq in (1, 2, 3):
        await conn.execute(
            "INSERT INTO blobs (vault_id, memory_id, device_id, vector_clock, ciphertext, hmac,"
            " created_at, created_at_ts, deleted, seq, size_bytes)"
            " VALUES ($1, $2, 'd1', 1, 'Y2lwaGVy', 'aG1hYw==', '2026-01-01T00:00:00Z',"
            " '2026-01-01T00:00:00Z', false, $3, 8)",
            vault_id,
            f"m{seq}",
            seq,
        )


def page_round_trips(url: str, *, named: bool, at_once: bool) -> tuple[int, int | None]:
    """(statements sent for the second page pull of a 3-blob vault, the device's recorded
    cursor afterwards)."""
    sent: list[str] = []
    vault = new_vault_id("pulltrips")

    def log(record: asyncpg.connection.LoggedQuery) -> None:
        sent.append(record.query)

    async def work() -> int | None:
        pool = await create_pool(url, min_size=1, max_size=1)  # the relay's own pool
        try:
            async with pool.acquire() as conn:
                await _vault_with_blobs(conn, vault)

            async def page(cursor: int) -> list[tuple[str, object]]:
                got = await pull_by_cursor(pool, vault, cursor, 2, "dev", max_bytes=1 << 20,
                                           named=named, at_once=at_once)  # fmt: skip
                return [(b.memory_id, b.seq) for b in got.blobs]

            assert await page(0) == [("m1", 1), ("m2", 2)]  # prepares the statements
            async with pool.acquire() as conn:
                conn.add_query_logger(log)
            assert await page(2) == [("m3", 3)]
            async with pool.acquire() as conn:
                conn.remove_query_logger(log)
                cursor: int | None = await conn.fetchval(
                    "SELECT pulled_cursor FROM devices WHERE vault_id = $1 AND device_id = 'dev'",
                    vault,
                )
                return cursor
        finally:
            await pool.close()

    cursor = asyncio.run(work())
    return len(sent), cursor


@pytest.mark.parametrize("named", [False, True])
def test_a_page_takes_two_round_trips_on_plain_postgres(database_url: str, named: bool) -> None:
    trips, cursor = page_round_trips(database_url, named=named, at_once=True)
    assert (trips, cursor) == (2, 3)


def test_the_citus_shape_keeps_its_statements(database_url: str) -> None:
    trips, cursor = page_round_trips(database_url, named=True, at_once=False)
    assert (trips, cursor) == (5, 3)


def test_the_one_round_trip_write_keeps_the_header_rule(database_url: str) -> None:
    """A header's device gets progress unless a key of the vault is bound to it; a key's own
    device always does; ids of any text are written as they are; the cursor never goes back."""

    async def work() -> dict[str, int | None]:
        conn = await asyncpg.connect(to_libpq_url(database_url))
        try:
            vault = new_vault_id("hexprog")
            await conn.execute("INSERT INTO vaults (vault_id) VALUES ($1)", vault)
            await conn.execute(
                "INSERT INTO api_keys (id, key_hash, prefix, vault_id, device_id)"
                " VALUES ($1, sha256(convert_to($1, 'UTF8')), 'p', $1, 'bound-dev')",
                vault,
            )
            for device in HOSTILE:
                await record_progress_at_once(conn, vault, device, 7, named=True)
                await record_progress_at_once(conn, vault, device, 5, named=True)  # not back
            await record_progress_at_once(conn, vault, "bound-dev", 9, named=True)
            await record_progress_at_once(conn, vault, "own-dev", 4, named=False)
            rows = await conn.fetch(
                "SELECT device_id, pulled_cursor FROM devices WHERE vault_id = $1", vault
            )
            return {r["device_id"]: r["pulled_cursor"] for r in rows}
        finally:
            await conn.close()

    assert asyncio.run(work()) == {**dict.fromkeys(HOSTILE, 7), "own-dev": 4}


def test_a_failed_write_leaves_the_connection_usable(database_url: str) -> None:
    """The statement failing (a negative cursor: the table's check) raises, and the
    transaction it opened is rolled back, not left aborted on the pooled connection."""

    async def work() -> int:
        conn = await asyncpg.connect(to_libpq_url(database_url))
        try:
            with pytest.raises(asyncpg.CheckViolationError):
                await record_progress_at_once(conn, new_vault_id("neg"), "d", -1, named=False)
            assert not conn.is_in_transaction()
            value: int = await conn.fetchval("SELECT 1")
            return value
        finally:
            await conn.close()

    assert asyncio.run(work()) == 1


def test_a_page_holds_each_blob_as_stored(database_url: str) -> None:
    """Every field of §3 and the `seq` of §9 from its own column (a page builds each blob
    from the row's position: a column order off by one swaps two fields)."""

    async def work() -> list[SyncBlob]:
        pool = await create_pool(database_url, min_size=1, max_size=1)
        try:
            vault = new_vault_id("fields")
            async with pool.acquire() as conn:
                await _vault_with_blobs(conn, vault)
            page = await pull_by_cursor(pool, vault, 2, 10, None, max_bytes=1 << 20)
            return page.blobs
        finally:
            await pool.close()

    [blob] = asyncio.run(work())
    assert blob == SyncBlob(
        vault_id=blob.vault_id, memory_id="m3", device_id="d1", vector_clock=1,
        ciphertext="Y2lwaGVy", hmac="aG1hYw==", created_at="2026-01-01T00:00:00Z",
        deleted=False, seq=3,
    )  # fmt: skip
    assert blob.vault_id.startswith("fields")


_FAILING_DEVICE = """
CREATE OR REPLACE FUNCTION test_refuse_progress() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.device_id = 'refused-dev' THEN RAISE EXCEPTION 'progress refused'; END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER test_refuse_progress BEFORE INSERT OR UPDATE ON devices
    FOR EACH ROW EXECUTE FUNCTION test_refuse_progress();
"""


@pytest.mark.parametrize("at_once", [True, False])
def test_a_failed_progress_write_fails_the_page(
    request: pytest.FixtureRequest, database_url: str, at_once: bool
) -> None:
    """Issue 36: the page's blobs are built while the progress is written
    (`relay.store.overlap.while_answered`); the write's failure (a trigger refusing one
    device's row) still fails the page, and the pooled connection is left usable, no
    statement in flight and no transaction open. Both statement shapes, on plain
    PostgreSQL: Citus has no triggers on distributed tables."""
    if backend_of(request) != "postgres":
        pytest.skip("the failure is a trigger's, and Citus refuses triggers on `devices`")

    async def work() -> int:
        pool = await create_pool(database_url, min_size=1, max_size=1)
        try:
            vault = new_vault_id("failprog")
            async with pool.acquire() as conn:
                await conn.execute(_FAILING_DEVICE)
                await _vault_with_blobs(conn, vault)
            with pytest.raises(asyncpg.RaiseError, match="progress refused"):
                await pull_by_cursor(pool, vault, 0, 10, "refused-dev", max_bytes=1 << 20,
                                     at_once=at_once)  # fmt: skip
            async with pool.acquire() as conn:
                assert not conn.is_in_transaction()
                value: int = await conn.fetchval("SELECT 1")
                return value
        finally:
            await pool.close()

    assert asyncio.run(work()) == 1
