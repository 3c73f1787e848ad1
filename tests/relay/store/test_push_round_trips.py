"""Round trips of a push group (issue 36), counted on a real PostgreSQL: every statement the
group's connection sends is one round trip (asyncpg's query logger sees each execute, fetch,
executemany and fetchmany; a pipelined executemany is one), counted after a first push
that prepared the statements (asyncpg's statement cache then skips the Parse round trip).

Plain PostgreSQL: a group of one vault in 4 (BEGIN with the lock, the vault row with the
stored versions, the blobs and devices, the vault row with COMMIT) and of several in 6 (the
vault rows and the stored versions in two statements, the vault rows' update before
COMMIT), where the statement-per-table
shape Citus needs takes 7 for one vault and 9 for several.
The NOTIFY after the commit is left out (`announce=False`): it is not part of the
transaction."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import asyncpg
import pytest

from engram_sync.relay.db.pool import create_pool
from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.domain.push_rules import check_structure
from engram_sync.relay.store.push import (
    PushJob,
    PushLimits,
    PushOutcome,
    Quota,
    plain_postgres,
    push_group,
)
from tests.conftest import backend_of
from tests.relay.support import Sealer, new_vault_id

pytestmark = pytest.mark.both_databases

PER_TABLE = PushLimits(max_blob_bytes=1_048_576, default_quota=Quota(0, 0), announce=False)
ONE_STATEMENT = replace(PER_TABLE, one_statement=True)


def round_trips(url: str, limits: PushLimits, vaults: int) -> tuple[int, list[str]]:
    """The statements of the second of two pushes of 3 new blobs to each of `vaults` vaults
    (one group), on one connection: (how many, the first words of each)."""
    sent: list[str] = []
    tag = new_vault_id("trips")
    sealers = [Sealer(f"{tag}-{k}") for k in range(vaults)]

    def jobs(round_: int) -> list[PushJob]:
        blobs = [[s.blob(f"m{round_}-{i}", 1) for i in range(3)] for s in sealers]
        return [
            PushJob(s.vault_id, check_structure(b, 1000), None)
            for s, b in zip(sealers, blobs, strict=True)
        ]

    def log(record: asyncpg.connection.LoggedQuery) -> None:
        sent.append(record.query)

    async def work() -> list[PushOutcome]:
        pool = await create_pool(url, min_size=1, max_size=1)  # the relay's own pool
        try:
            await push_group(pool, jobs(0), limits)  # creates the vaults, prepares
            async with pool.acquire() as conn:
                conn.add_query_logger(log)
            results = await push_group(pool, jobs(1), limits)
            async with pool.acquire() as conn:
                conn.remove_query_logger(log)
        finally:
            await pool.close()
        return [r for r in results if isinstance(r, PushOutcome)]

    outcomes = asyncio.run(work())
    assert [len(o.plan.accepted) for o in outcomes] == [3] * vaults
    assert not sent or sent[-1].endswith("COMMIT") or sent[-1].startswith("COMMIT")
    return len(sent), [" ".join(q.split()[:2]) for q in sent]


def test_a_push_to_one_vault_takes_four_round_trips_on_plain_postgresql(
    request: pytest.FixtureRequest, database_url: str
) -> None:
    if backend_of(request) != "postgres":
        pytest.skip("the one-statement shape is plain PostgreSQL's (Citus refuses it)")
    count, statements = round_trips(database_url, ONE_STATEMENT, vaults=1)
    assert count == 4, statements
    assert statements[0] == "BEGIN; SELECT"  # the lock
    assert statements[-1] == "UPDATE vaults"  # ...; COMMIT
    assert count < round_trips(database_url, PER_TABLE, vaults=1)[0] == 7


@pytest.mark.parametrize("vaults", [2, 8])
def test_a_push_group_over_vaults_takes_six_round_trips_on_plain_postgresql(
    request: pytest.FixtureRequest, database_url: str, vaults: int
) -> None:
    """Issue 36: BEGIN with every vault's lock, the vault rows, the stored versions (one
    statement a vault, pipelined), the blobs and devices (one statement a vault, pipelined),
    the vault rows (pipelined), COMMIT; the Citus shape takes 9 (BEGIN, existing, locks, rows,
    known, three writes, COMMIT)."""
    if backend_of(request) != "postgres":
        pytest.skip("the one-statement shape is plain PostgreSQL's (Citus refuses it)")
    count, statements = round_trips(database_url, ONE_STATEMENT, vaults=vaults)
    assert count == 6, statements
    assert statements[0] == "BEGIN; SELECT"  # the locks
    assert statements[-1] == "COMMIT"
    assert round_trips(database_url, PER_TABLE, vaults=vaults)[0] == 9


def test_the_shape_follows_the_database(request: pytest.FixtureRequest, database_url: str) -> None:
    """`plain_postgres` (the relay's choice at startup): the one-statement shape on plain
    PostgreSQL, the statement-per-table shape on Citus, where it still takes 7."""

    async def plain() -> bool:
        conn = await asyncpg.connect(to_libpq_url(database_url))
        try:
            return await plain_postgres(conn)
        finally:
            await conn.close()

    on_citus = backend_of(request) == "citus"
    assert asyncio.run(plain()) is not on_citus
    if on_citus:
        assert round_trips(database_url, PER_TABLE, vaults=1)[0] == 7
