"""Group commit of pushes (relay/services/push_groups.py, relay/store/push.py) on a real PostgreSQL.

The central property: a group of pushes run as one transaction answers and stores
exactly what the same pushes give when each runs alone, one after the other.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

import asyncpg
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.domain.domain_errors import PushRefusedError, QuotaExceededError
from engram_sync.relay.domain.push_rules import check_structure
from engram_sync.relay.services.push_groups import PushGroups
from engram_sync.relay.store.push import PushJob, PushLimits, PushResult, Quota, push_group
from engram_sync.shared_format import SyncBlob
from tests.conftest import backend_of, takes_backend
from tests.relay.bucket_oracle import oracle, stored
from tests.relay.support import Sealer, migrated_backend_database, new_vault_id

#: The same tests on the Citus cluster too, by default (issue 18, tests/conftest.py).
pytestmark = pytest.mark.both_databases

T = TypeVar("T")
LIMITS = PushLimits(max_blob_bytes=1_048_576, default_quota=Quota(0, 0))
# Issue 36: the shape the relay uses on plain PostgreSQL (a group of one vault in four round
# trips, each vault's writes in one statement); Citus keeps LIMITS's statement per table.
ONE_STATEMENT = replace(LIMITS, one_statement=True)
TEMPLATE = Sealer("template").blob("m", 1)
DEVICES = ("dev-a", "dev-b", "dev-c", "dev-revoked")
MEMORIES = ("m0", "m1", "m2", "m3")


@pytest.fixture(scope="module")
@takes_backend
def database_url(request: pytest.FixtureRequest, postgres_url: str) -> Iterator[str]:
    with migrated_backend_database(request, postgres_url) as url:
        yield url


@pytest.fixture
def shape(request: pytest.FixtureRequest, database_url: str) -> PushLimits:
    """The limits the relay would push with on this test's database (`plain_postgres`)."""
    return ONE_STATEMENT if backend_of(request) == "postgres" else LIMITS


def run(database_url: str, work: Callable[[asyncpg.Pool], Awaitable[T]]) -> T:
    """`work` on a small pool to the test database, from sync test code."""

    async def go() -> T:
        pool = await asyncpg.create_pool(to_libpq_url(database_url), min_size=1, max_size=6)
        try:
            return await work(pool)
        finally:
            await pool.close()

    return asyncio.run(go())


def blob(vault_id: str, memory_id: str, device_id: str, clock: int, chars: int = 40,
         deleted: bool = False) -> SyncBlob:  # fmt: skip
    """A structurally valid blob (the relay never decrypts) whose ciphertext has `chars`."""
    raw = random.Random(f"{memory_id}{clock}{chars}").randbytes(chars // 4 * 3)
    return msgspec.structs.replace(
        TEMPLATE,
        vault_id=vault_id,
        memory_id=memory_id,
        device_id=device_id,
        vector_clock=clock,
        ciphertext=base64.b64encode(raw).decode("ascii"),
        deleted=deleted,
    )


def job(vault_id: str, blobs: list[SyncBlob], bound: str | None = None) -> PushJob:
    return PushJob(vault_id, check_structure(blobs, 1000), bound_device=bound)


def summary(result: PushResult) -> tuple[Any, ...]:
    """What the push answers (or the error it gets), comparable across vault names."""
    if isinstance(result, QuotaExceededError):
        return ("refused", result.detail, result.limit, result.used)
    if isinstance(result, PushRefusedError):
        raise AssertionError(f"a refusal summary() does not know: {result!r}")
    plan = result.plan
    return (
        [(c.blob.memory_id, c.blob.vector_clock) for c in plan.accepted],
        plan.rejected,
        plan.revoked_devices,
        dict(plan.reasons),
        result.cursor,
    )


async def vault_state(conn: asyncpg.Connection, vault_id: str) -> tuple[Any, ...]:
    """Everything a push may change in one vault, in a comparable form."""
    blobs = await conn.fetch(
        "SELECT memory_id, device_id, vector_clock, deleted, seq, size_bytes, ciphertext"
        " FROM blobs WHERE vault_id = $1 ORDER BY seq",
        vault_id,
    )
    vault = await conn.fetch(
        "SELECT seq, bytes_used, live_blobs, tombstones FROM vaults WHERE vault_id = $1", vault_id
    )
    counted = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE NOT deleted) AS live, count(*) FILTER (WHERE deleted)"
        " AS dead, coalesce(sum(size_bytes), 0) AS size FROM blobs WHERE vault_id = $1",
        vault_id,
    )
    # the counts the pushes keep are the counts of the rows (0003_vault_counts)
    assert [tuple(vault[0])[1:]] == [(counted["size"], counted["live"], counted["dead"])]
    # and so are the bucket prefixes and counts (PROTOCOL §18, 0012_bucket_prefixes)
    assert await stored(conn, vault_id) == await oracle(conn, vault_id)
    devices = await conn.fetch(
        "SELECT device_id, revoked_at IS NOT NULL AS revoked FROM devices WHERE vault_id = $1"
        " ORDER BY device_id",
        vault_id,
    )
    return tuple(tuple(map(tuple, rows)) for rows in (blobs, vault, devices))


# --- the equivalence property --------------------------------------------------------------

BlobSpec = tuple[str, str, int, int, bool, bool]  # memory, device, clock, chars, deleted, wrong

blob_specs = st.tuples(
    st.sampled_from(MEMORIES),
    st.sampled_from(DEVICES),
    st.integers(1, 4),
    st.sampled_from([40, 400, 1200]),
    st.booleans(),
    st.integers(0, 9).map(lambda n: n == 0),  # now and then a blob for the wrong vault
)
job_specs = st.tuples(
    st.sampled_from(["A", "B"]),
    st.lists(blob_specs, min_size=1, max_size=4),
    st.sampled_from([None, None, "dev-a"]),  # a device-bound key now and then
)


async def _prepare(pool: asyncpg.Pool, names: dict[str, str], pre: list[BlobSpec]) -> None:
    """Both vaults hold the same earlier blobs; B has quotas; one device is revoked in A."""
    for vault_id in names.values():
        await pool.execute("INSERT INTO vaults (vault_id) VALUES ($1)", vault_id)
    await pool.execute(
        "INSERT INTO quotas (vault_id, max_devices, max_bytes) VALUES ($1, 2, 3000)", names["B"]
    )
    await pool.execute(
        "INSERT INTO devices (vault_id, device_id, revoked_at) VALUES ($1, 'dev-revoked', now())",
        names["A"],
    )
    for vault_id in names.values():
        for memory, device, clock, chars, deleted, _ in pre:
            pushed = blob(vault_id, memory, device, clock, chars, deleted)
            await push_group(pool, [job(vault_id, [pushed])], LIMITS)


def make_jobs(
    names: dict[str, str], specs: list[tuple[str, list[BlobSpec], str | None]]
) -> list[PushJob]:
    jobs = []
    for vault, blob_list, bound in specs:
        vault_id = names[vault]
        other = names["B" if vault == "A" else "A"]
        jobs.append(
            job(
                vault_id,
                [
                    blob(other if wrong else vault_id, memory, device, clock, chars, deleted)
                    for memory, device, clock, chars, deleted, wrong in blob_list
                ],
                bound,
            )
        )
    return jobs


#: Examples per backend: a Citus example is a few multi-shard transactions and a new pool,
#: ~2.7 s on 2 loaded cores against ~0.2 s, so CI runs a smaller sample there (issue 18).
EXAMPLES = {"postgres": 60, "citus": 12}


def test_a_group_answers_and_stores_what_running_alone_would(
    request: pytest.FixtureRequest, database_url: str, shape: PushLimits
) -> None:
    """The group in the database's shape, each push alone in the statement-per-table shape:
    on plain PostgreSQL the two shapes are checked against each other too."""

    @settings(
        max_examples=EXAMPLES[backend_of(request)],
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        pre=st.lists(blob_specs.filter(lambda s: s[1] != "dev-revoked"), max_size=3),
        specs=st.lists(job_specs, min_size=1, max_size=8),
    )
    def check(pre: list[BlobSpec], specs: list[tuple[str, list[BlobSpec], str | None]]) -> None:
        tag = new_vault_id("eq")
        grouped = {"A": f"{tag}-g-A", "B": f"{tag}-g-B"}
        alone = {"A": f"{tag}-s-A", "B": f"{tag}-s-B"}

        async def work(pool: asyncpg.Pool) -> None:
            await _prepare(pool, grouped, pre)
            await _prepare(pool, alone, pre)
            group_results = await push_group(pool, make_jobs(grouped, specs), shape)
            alone_results = [
                (await push_group(pool, [j], LIMITS))[0] for j in make_jobs(alone, specs)
            ]
            assert [summary(r) for r in group_results] == [summary(r) for r in alone_results]
            async with pool.acquire() as conn:
                for vault in ("A", "B"):
                    assert await vault_state(conn, grouped[vault]) == await vault_state(
                        conn, alone[vault]
                    )

        run(database_url, work)

    check()


def test_a_refused_push_leaves_the_rest_of_its_group_alone(
    database_url: str, shape: PushLimits
) -> None:
    vault = new_vault_id("refused")

    async def work(pool: asyncpg.Pool) -> list[PushResult]:
        async with pool.acquire() as conn:
            await conn.execute("INSERT INTO vaults (vault_id) VALUES ($1)", vault)
            await conn.execute(
                "INSERT INTO quotas (vault_id, max_devices, max_bytes) VALUES ($1, 0, 1000)", vault
            )
        return await push_group(
            pool,
            [
                job(vault, [blob(vault, "small-1", "dev-a", 1, 400)]),
                job(vault, [blob(vault, "big", "dev-a", 1, 800)]),  # 400 + 800 > 1000
                job(vault, [blob(vault, "small-2", "dev-a", 1, 400)]),
            ],
            shape,
        )

    first, refused, third = run(database_url, work)
    assert isinstance(refused, QuotaExceededError)
    assert (refused.detail, refused.limit, refused.used) == ("bytes", 1000, 1200)
    assert summary(first)[0] == [("small-1", 1)]
    assert summary(first)[-1] == 1
    assert summary(third)[0] == [("small-2", 1)]
    assert summary(third)[-1] == 2
    rows = run(database_url, lambda pool: pool.fetch(
        "SELECT memory_id, seq FROM blobs WHERE vault_id = $1 ORDER BY seq", vault))  # fmt: skip
    assert [tuple(r) for r in rows] == [("small-1", 1), ("small-2", 2)]


# --- the lanes ------------------------------------------------------------------------------


class CountingRunner:
    """The real group transaction, recording the size of every group it ran."""

    def __init__(self, pool: asyncpg.Pool, limits: PushLimits) -> None:
        self.pool = pool
        self.limits = limits
        self.sizes: list[int] = []

    async def __call__(
        self, jobs: list[PushJob], committed: Callable[[list[PushResult]], None]
    ) -> list[PushResult]:
        self.sizes.append(len(jobs))
        return await push_group(self.pool, jobs, self.limits, committed)


@pytest.fixture
def pool_factory(database_url: str) -> Callable[[], Any]:
    @contextlib.asynccontextmanager
    async def make() -> AsyncIterator[asyncpg.Pool]:
        pool = await asyncpg.create_pool(to_libpq_url(database_url), min_size=1, max_size=6)
        try:
            yield pool
        finally:
            await pool.close()

    return make


def test_concurrent_pushes_share_transactions_and_a_lone_push_runs_alone(
    pool_factory: Callable[[], Any], shape: PushLimits
) -> None:
    vault = new_vault_id("shared")
    pushes = 40

    async def work() -> tuple[list[int], list[int], list[int], list[int]]:
        async with pool_factory() as pool:
            runner = CountingRunner(pool, shape)
            groups = PushGroups(runner, lanes=2, max_group_blobs=2000)
            lone = await groups.push(job(vault, [blob(vault, "lone", "dev-a", 1)]))
            lone_sizes = list(runner.sizes)
            outcomes = await asyncio.gather(
                *(
                    groups.push(job(vault, [blob(vault, f"m{i}", "dev-a", 1)]))
                    for i in range(pushes)
                )
            )
            seqs = [r["seq"] for r in await pool.fetch(
                "SELECT seq FROM blobs WHERE vault_id = $1 ORDER BY seq", vault)]  # fmt: skip
            return [*lone_sizes, lone.cursor], runner.sizes[1:], [o.cursor for o in outcomes], seqs

    lone, sizes, cursors, seqs = asyncio.run(work())
    assert lone == [1, 1]  # alone: a group of one, at once
    assert sum(sizes) == pushes
    assert len(sizes) < pushes  # concurrent pushes shared transactions
    assert sorted(cursors) == list(range(2, pushes + 2))  # every push its own sequence number
    assert seqs == list(range(1, pushes + 2))


def test_the_blob_cap_splits_groups(pool_factory: Callable[[], Any], shape: PushLimits) -> None:
    vault = new_vault_id("capped")

    async def work() -> list[int]:
        async with pool_factory() as pool:
            runner = CountingRunner(pool, shape)
            groups = PushGroups(runner, lanes=1, max_group_blobs=5)
            await asyncio.gather(*(
                groups.push(job(vault, [blob(vault, f"m{i}-{k}", "dev-a", 1) for k in range(3)]))
                for i in range(6)
            ))  # fmt: skip
            return runner.sizes

    sizes = asyncio.run(work())
    assert sum(sizes) == 6
    assert max(sizes) == 1  # two pushes of 3 blobs never fit a cap of 5


def test_a_bad_value_fails_only_its_own_push(
    pool_factory: Callable[[], Any], shape: PushLimits
) -> None:
    """A value PostgreSQL refuses (a NUL in text; the routes never let one through) rolls
    back its group; the group is run again push by push, so only that push fails."""
    vault = new_vault_id("poison")
    poisoned = job(vault, [blob(vault, "bad", "dev-a", 1)])
    poisoned.checked[0] = poisoned.checked[0].__class__(
        0,
        msgspec.structs.replace(poisoned.checked[0].blob, hmac="\x00" * 44),
        poisoned.checked[0].created_at_ts,
        poisoned.checked[0].size_bytes,
    )

    async def work() -> list[Any]:
        async with pool_factory() as pool:
            groups = PushGroups(CountingRunner(pool, shape), lanes=1, max_group_blobs=2000)
            return await asyncio.gather(  # type: ignore[return-value]
                groups.push(job(vault, [blob(vault, "good-1", "dev-a", 1)])),
                groups.push(job(vault, [blob(vault, "good-2", "dev-a", 1)])),
                groups.push(poisoned),
                groups.push(job(vault, [blob(vault, "good-3", "dev-a", 1)])),
                return_exceptions=True,
            )

    results = asyncio.run(work())
    assert isinstance(results[2], asyncpg.DataError)
    assert [summary(r)[0] for i, r in enumerate(results) if i != 2] == [
        [("good-1", 1)], [("good-2", 1)], [("good-3", 1)]
    ]  # fmt: skip


def test_two_replicas_with_overlapping_groups_never_deadlock(
    pool_factory: Callable[[], Any], shape: PushLimits
) -> None:
    """Two processes' worth of lanes push to overlapping sets of new and existing vaults."""
    tag = new_vault_id("overlap")
    vaults = [f"{tag}-{k}" for k in range(6)]
    rng = random.Random(7)
    plan = [(rng.choice(vaults), i) for i in range(240)]

    async def work() -> tuple[int, list[tuple[str, int]]]:
        async with pool_factory() as pool_1, pool_factory() as pool_2:
            replicas = [
                PushGroups(CountingRunner(p, shape), lanes=2, max_group_blobs=2000)
                for p in (pool_1, pool_2)
            ]
            outcomes = await asyncio.gather(*(
                replicas[i % 2].push(job(v, [blob(v, f"m{i}", f"dev-{i % 5}", 1)]))
                for v, i in plan
            ))  # fmt: skip
            rows = await pool_1.fetch(
                "SELECT vault_id, seq FROM vaults WHERE vault_id LIKE $1 ORDER BY 1", tag + "-%"
            )
            return sum(len(o.plan.accepted) for o in outcomes), [tuple(r) for r in rows]

    accepted, seqs = asyncio.run(work())
    assert accepted == len(plan)
    expected = {v: sum(1 for w, _ in plan if w == v) for v in vaults}
    assert seqs == sorted(expected.items())


class RacingConnection(asyncpg.Connection):  # type: ignore[misc]
    """A real connection on which another session creates `race_vault` (committed) right
    after this one's vault locks ran, and which records, at the blob write, which vaults
    of the write another session could still lock (NOWAIT): none, if the group holds them."""

    race_vault = ""
    url = ""
    unlocked_at_write: list[str]
    locks_run = 0

    async def executemany(self, command: str, args: Any, *, timeout: float | None = None) -> None:
        if command.startswith("INSERT INTO blobs") or "INSERT INTO blobs" in command:
            others = await asyncpg.connect(self.url)
            try:
                for columns in args:
                    vault_id = columns[0][0]
                    try:
                        async with others.transaction():
                            await others.execute(
                                "SELECT 1 FROM vaults WHERE vault_id = $1 FOR UPDATE NOWAIT",
                                vault_id,
                            )
                        type(self).unlocked_at_write.append(vault_id)
                    except asyncpg.LockNotAvailableError:
                        pass
            finally:
                await others.close()
        await super().executemany(command, args, timeout=timeout)
        if command.endswith("FOR UPDATE"):
            type(self).locks_run += 1
            if type(self).locks_run == 1:  # the race window, the first time only
                others = await asyncpg.connect(self.url)
                try:
                    await others.execute(
                        "INSERT INTO vaults (vault_id) VALUES ($1) ON CONFLICT DO NOTHING",
                        self.race_vault,
                    )
                finally:
                    await others.close()


def test_a_vault_created_while_the_group_locks_is_locked_before_it_is_written(
    database_url: str,
) -> None:
    """Found by CI as a deadlock of two replicas: a vault created by another session between
    a group's lock statements and its read of the rows was written without its lock."""
    existing, racing = new_vault_id("locked"), new_vault_id("racing")
    url = to_libpq_url(database_url)
    RacingConnection.race_vault, RacingConnection.url = racing, url
    RacingConnection.unlocked_at_write, RacingConnection.locks_run = [], 0

    async def work() -> list[PushResult]:
        setup = await asyncpg.connect(url)
        try:
            await setup.execute("INSERT INTO vaults (vault_id) VALUES ($1)", existing)
        finally:
            await setup.close()
        pool = await asyncpg.create_pool(
            url, min_size=1, max_size=1, connection_class=RacingConnection
        )
        try:
            jobs = [job(existing, [blob(existing, "m1", "dev-a", 1)]),
                    job(racing, [blob(racing, "m1", "dev-a", 1)])]  # fmt: skip
            return await push_group(pool, jobs, LIMITS)
        finally:
            await pool.close()

    results = asyncio.run(work())
    assert [summary(r)[0] for r in results] == [[("m1", 1)], [("m1", 1)]]
    assert RacingConnection.locks_run >= 1  # the race window was opened
    assert RacingConnection.unlocked_at_write == []  # both were locked at the write


def test_a_cancelled_push_does_not_disturb_the_others(
    pool_factory: Callable[[], Any], shape: PushLimits
) -> None:
    vault = new_vault_id("cancel")

    async def work() -> tuple[bool, list[int]]:
        async with pool_factory() as pool:
            groups = PushGroups(CountingRunner(pool, shape), lanes=1, max_group_blobs=2000)
            tasks = [
                asyncio.create_task(groups.push(job(vault, [blob(vault, f"m{i}", "dev-a", 1)])))
                for i in range(10)
            ]
            await asyncio.sleep(0)  # every push is queued; the first group is in flight
            tasks[5].cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            cancelled = isinstance(results[5], asyncio.CancelledError)
            return cancelled, sorted(
                r.cursor
                for i, r in enumerate(results)
                if i != 5 and not isinstance(r, BaseException)
            )

    cancelled, cursors = asyncio.run(work())
    assert cancelled
    assert len(cursors) == 9  # the others were all answered
    assert len(set(cursors)) == 9
