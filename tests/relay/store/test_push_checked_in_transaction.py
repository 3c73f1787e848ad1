"""Issue 36: a push's §6 step 1 runs inside its group's transaction, while the database
reads the stored versions, and the pushes are answered at the commit, before the group's
NOTIFY. On a real PostgreSQL; the refusals stay what they were: a structurally invalid push
is refused alone (its group's others go on), writes nothing, and creates no vault."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import asyncpg
import msgspec
import pytest

from engram_sync.relay.domain.domain_errors import InvalidBlobError
from engram_sync.relay.services.push_groups import PushGroups
from engram_sync.relay.store import push as push_store
from engram_sync.relay.store.feed_notify import Commit
from engram_sync.relay.store.push import (
    PushJob,
    PushLimits,
    PushOutcome,
    PushResult,
    Quota,
    push_group,
)
from tests.relay.services.test_push_groups import blob, run
from tests.relay.support import new_vault_id

pytestmark = pytest.mark.both_databases

LIMITS = PushLimits(max_blob_bytes=1_048_576, default_quota=Quota(0, 0), announce=False)


@pytest.fixture(params=[True, False], ids=["one_statement", "per_table"])
def limits(request: pytest.FixtureRequest, database_url: str) -> PushLimits:
    if request.param and "citus" in request.node.nodeid:
        pytest.skip("Citus pushes a statement per table")
    return replace(LIMITS, one_statement=request.param)


def _bad(vault_id: str, memory_id: str) -> msgspec.Struct:
    return msgspec.structs.replace(blob(vault_id, memory_id, "dev-a", 1), hmac="not base64!")


async def _stored(pool: asyncpg.Pool, vault_id: str) -> tuple[bool, list[str]]:
    exists = await pool.fetchval("SELECT EXISTS (SELECT 1 FROM vaults WHERE vault_id = $1)",
                                 vault_id)  # fmt: skip
    rows = await pool.fetch("SELECT memory_id FROM blobs WHERE vault_id = $1 ORDER BY 1", vault_id)
    return bool(exists), [r["memory_id"] for r in rows]


def test_an_invalid_push_is_refused_alone_and_its_group_goes_on(
    database_url: str, limits: PushLimits
) -> None:
    vault = new_vault_id("checked")
    first = PushJob.of_request(vault, [blob(vault, "m0", "dev-a", 1)], None)

    async def work(pool: asyncpg.Pool) -> tuple[list[PushResult], tuple[bool, list[str]]]:
        await push_group(pool, [first], limits)  # the vault exists from here on
        jobs = [
            PushJob.of_request(vault, [blob(vault, "m1", "dev-a", 1)], None),
            PushJob.of_request(vault, [blob(vault, "m2", "dev-a", 1), _bad(vault, "m3")], None),
            PushJob.of_request(vault, [blob(vault, "m4", "dev-a", 1)], None),
        ]
        return await push_group(pool, jobs, limits), await _stored(pool, vault)

    results, (_, memories) = run(database_url, work)
    good, refused, after = results
    assert isinstance(refused, InvalidBlobError)
    assert (refused.index, refused.field) == (1, "hmac")
    assert isinstance(good, PushOutcome)
    assert isinstance(after, PushOutcome)
    assert (good.cursor, after.cursor) == (2, 3)  # the refused push took no sequence number
    assert memories == ["m0", "m1", "m4"]


def test_an_invalid_first_push_creates_no_vault(database_url: str, limits: PushLimits) -> None:
    vault = new_vault_id("never")

    async def work(pool: asyncpg.Pool) -> tuple[list[PushResult], tuple[bool, list[str]]]:
        job = PushJob.of_request(vault, [blob(vault, "m0", "dev-a", 1), _bad(vault, "m1")], None)
        return await push_group(pool, [job], limits), await _stored(pool, vault)

    [result], stored = run(database_url, work)
    assert isinstance(result, InvalidBlobError)
    assert stored == (False, [])


def test_pushes_are_answered_at_the_commit_before_the_notify(
    database_url: str, limits: PushLimits, monkeypatch: pytest.MonkeyPatch
) -> None:
    vault = new_vault_id("answered")
    events: list[str] = []
    notified = asyncio.Event()

    async def held_announce(conn: asyncpg.Connection, commits: list[Commit]) -> None:
        events.append("notify sent")
        await notified.wait()  # a NOTIFY that takes its time

    monkeypatch.setattr(push_store, "announce", held_announce)
    announcing = replace(limits, announce=True)

    async def runner(jobs: list[PushJob], committed: object) -> list[PushResult]:
        return await push_group(pool_ref[0], jobs, announcing, committed)  # type: ignore[arg-type]

    pool_ref: list[asyncpg.Pool] = []

    async def work(pool: asyncpg.Pool) -> PushOutcome:
        pool_ref.append(pool)
        await push_group(pool, [PushJob.of_request(vault, [blob(vault, "m0", "dev-a", 1)], None)],
                         limits)  # fmt: skip
        groups = PushGroups(runner, lanes=1, max_group_blobs=1000)
        job = PushJob.of_request(vault, [blob(vault, "m1", "dev-a", 1)], None)
        try:
            outcome = await asyncio.wait_for(groups.push(job), timeout=10)
            events.append("answered")
        finally:
            notified.set()
        await asyncio.sleep(0.05)  # the lane's task finishes its NOTIFY
        return outcome

    outcome = run(database_url, work)
    assert outcome.cursor == 2
    assert events == ["notify sent", "answered"]  # answered while the NOTIFY was still held
