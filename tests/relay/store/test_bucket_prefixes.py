"""The stored bucket prefixes and counts of `?buckets=1` (PROTOCOL §18, revision 0012).

After pushes (new memories, replacements, tombstones; several vaults in one group),
compaction and the retire erase, `vaults.bucket_prefixes` and `vaults.bucket_counts`
equal what a full computation over the vault's rows gives: here in Python with hashlib
(tests/relay/bucket_oracle.py), and the relay's old grouped SQL
(`relay.store.digest.bucket_digests(..., None)`) agrees with it. Revision 0012's
backfill is checked against the pushes.
"""

from __future__ import annotations

import hashlib
import importlib
import random
from datetime import timedelta

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram_sync.relay.store.compaction import compact_vault
from engram_sync.relay.store.digest import bucket_of_sql
from engram_sync.relay.store.push import push_group
from engram_sync.relay.store.retire import erase_expired, retire
from tests.conftest import backend_of
from tests.relay.bucket_oracle import oracle, stored
from tests.relay.services.test_push_groups import LIMITS, blob, job, run
from tests.relay.support import new_vault_id

#: The same tests on the Citus cluster too, by default (issue 18, tests/conftest.py).
pytestmark = pytest.mark.both_databases

MIGRATION = importlib.import_module("engram_sync.relay.migrations.versions.0012_bucket_prefixes")
ZERO = (bytes(2048), [0] * 256)


# --- pushes ---------------------------------------------------------------------------------

MEMORIES = [f"mem-{i}" for i in range(40)]  # 40 memories over at most 40 of the 256 buckets
DEVICES = ("dev-a", "dev-b")

push_specs = st.lists(
    st.tuples(
        st.sampled_from(["A", "B", "C"]),  # the vault
        st.lists(
            st.tuples(
                st.sampled_from(MEMORIES),
                st.sampled_from(DEVICES),
                st.integers(1, 5),  # the clock: equal or lower ones are rejected
                st.booleans(),  # a tombstone
            ),
            min_size=1,
            max_size=6,
        ),
    ),
    min_size=1,
    max_size=6,
)

EXAMPLES = {"postgres": 40, "citus": 8}


def test_random_push_groups_keep_the_prefixes_of_the_rows(
    request: pytest.FixtureRequest, database_url: str
) -> None:
    @settings(
        max_examples=EXAMPLES[backend_of(request)],
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(groups=st.lists(push_specs, min_size=1, max_size=4))
    def check(groups: list[list[tuple[str, list[tuple[str, str, int, bool]]]]]) -> None:
        tag = new_vault_id("bp")
        names = {v: f"{tag}-{v}" for v in "ABC"}

        async def work(pool: asyncpg.Pool) -> None:
            for specs in groups:  # each a group of pushes: several vaults in one transaction
                jobs = [
                    job(names[v], [blob(names[v], m, d, c, deleted=x) for m, d, c, x in blobs])
                    for v, blobs in specs
                ]
                await push_group(pool, jobs, LIMITS)
                async with pool.acquire() as conn:
                    for vault_id in names.values():
                        if await conn.fetchval("SELECT 1 FROM vaults WHERE vault_id = $1",
                                               vault_id):  # fmt: skip
                            assert await stored(conn, vault_id) == await oracle(conn, vault_id)

        run(database_url, work)

    check()


def _memory_in_bucket(bucket: int, start: int = 0) -> str:
    return next(
        m
        for i in range(start, start + 100_000)
        if hashlib.sha256((m := f"same-{i}").encode()).digest()[0] == bucket
    )


def test_replacements_keep_the_count_and_move_the_prefix(database_url: str) -> None:
    vault = new_vault_id("bp-replace")
    memory = _memory_in_bucket(7)
    other = _memory_in_bucket(7, start=int(memory.split("-")[1]) + 1)  # the same bucket

    async def work(pool: asyncpg.Pool) -> list[tuple[bytes, list[int]]]:
        states = []
        for blobs in (
            [blob(vault, memory, "dev-a", 1), blob(vault, other, "dev-a", 1)],
            [blob(vault, memory, "dev-b", 2)],  # a replacement by another device
            [blob(vault, memory, "dev-a", 3, deleted=True)],  # and its tombstone
        ):
            await push_group(pool, [job(vault, blobs)], LIMITS)
            async with pool.acquire() as conn:
                mine = await stored(conn, vault)
                assert mine == await oracle(conn, vault)
                states.append(mine)
        return states

    first, replaced, deleted = run(database_url, work)
    assert first[1][7] == replaced[1][7] == deleted[1][7] == 2
    assert sum(deleted[1]) == 2
    assert len({first[0], replaced[0], deleted[0]}) == 3
    untouched = [b for b in range(256) if b != 7]
    assert all(first[0][8 * b : 8 * b + 8] == bytes(8) for b in untouched)


# --- compaction and the retire erase ----------------------------------------------------------


def test_compaction_takes_tombstones_out_of_their_buckets(database_url: str) -> None:
    vault = new_vault_id("bp-compact")
    rng = random.Random(12)
    memories = [f"c-{i}" for i in range(120)]
    dead = set(rng.sample(memories, 50))

    async def work(pool: asyncpg.Pool) -> tuple[tuple[bytes, list[int]], ...]:
        await push_group(pool, [job(vault, [blob(vault, m, "dev-a", 1) for m in memories])],
                         LIMITS)  # fmt: skip
        await push_group(
            pool,
            [job(vault, [blob(vault, m, "dev-a", 2, deleted=True) for m in sorted(dead)])],
            LIMITS,
        )
        async with pool.acquire() as conn:
            before = await stored(conn, vault)
            await conn.execute(
                "UPDATE blobs SET received_at = now() - interval '40 days' WHERE vault_id = $1",
                vault,
            )
            await conn.execute(
                "UPDATE devices SET last_seen = now() - interval '40 days' WHERE vault_id = $1",
                vault,
            )
            assert (await compact_vault(conn, vault, timedelta(days=30))).removed == len(dead)
            return before, await stored(conn, vault), await oracle(conn, vault)

    before, after, computed = run(database_url, work)
    assert after == computed
    assert sum(before[1]) == 120
    assert sum(after[1]) == 120 - len(dead)
    assert after[0] != before[0]


def test_the_retire_erase_zeroes_them(database_url: str) -> None:
    vault = new_vault_id("bp-erase")
    kept = new_vault_id("bp-kept")

    async def work(pool: asyncpg.Pool) -> tuple[tuple[bytes, list[int]], ...]:
        for vault_id in (vault, kept):
            await push_group(
                pool, [job(vault_id, [blob(vault_id, f"e-{i}", "dev-a", 1) for i in range(30)])],
                LIMITS,
            )  # fmt: skip
        await retire(pool, vault, None, timedelta(0))
        async with pool.acquire() as conn:
            before = await stored(conn, vault)
            assert await erase_expired(conn) >= 1
            return before, await stored(conn, vault), await stored(conn, kept)

    before, after, other = run(database_url, work)
    assert sum(before[1]) == 30
    assert after == ZERO
    assert sum(other[1]) == 30  # the positive case beside it: a live vault keeps its own


# --- revision 0012's backfill -----------------------------------------------------------------


def test_the_backfill_of_revision_0012_matches_the_pushes(database_url: str) -> None:
    vault = new_vault_id("bp-backfill")
    empty = new_vault_id("bp-empty")

    async def work(pool: asyncpg.Pool) -> tuple[tuple[bytes, list[int]], ...]:
        await push_group(
            pool,
            [job(vault, [blob(vault, f"b-{i}", "dev-a", i + 1, deleted=i % 3 == 0)
                         for i in range(200)])],
            LIMITS,
        )  # fmt: skip
        await push_group(pool, [job(vault, [blob(vault, "b-5", "dev-b", 9)])], LIMITS)
        async with pool.acquire() as conn:
            await conn.execute("INSERT INTO vaults (vault_id) VALUES ($1)", empty)
            pushed = await stored(conn, vault)
            # (the rows have no bucket column since revision 0014: the backfill computes
            # each row's bucket from its id, as the bucket answers do)
            await conn.execute(
                "UPDATE vaults SET bucket_prefixes = $2, bucket_counts = $3"
                " WHERE vault_id = ANY($1::text[])",
                [vault, empty],
                b"\xff" * 2048,
                bytes(1024),
            )
            zeroed = await stored(conn, vault)
            await conn.execute(
                MIGRATION.backfill(f"vault_id = '{vault}'", bucket_of_sql("memory_id"))
            )
            return pushed, zeroed, await stored(conn, vault), await stored(conn, empty)

    pushed, zeroed, filled, untouched = run(database_url, work)
    assert zeroed != pushed
    assert filled == pushed
    assert sum(filled[1]) == 200
    # the filter holds: the other vault (made to differ) is not touched by this backfill
    assert untouched == (b"\xff" * 2048, [0] * 256)


def test_a_new_vault_starts_at_zero(database_url: str) -> None:
    vault = new_vault_id("bp-new")

    async def work(pool: asyncpg.Pool) -> tuple[bytes, list[int]]:
        async with pool.acquire() as conn:
            await conn.execute("INSERT INTO vaults (vault_id) VALUES ($1)", vault)
            return await stored(conn, vault)

    assert run(database_url, work) == ZERO
