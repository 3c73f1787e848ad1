"""Commit-ordered cursors under concurrency and across a relay restart (PROTOCOL §6, §9).

20 pushers (threads, each with its own HTTP client) and 3 cursor pullers on one vault:
every accepted blob reaches every puller exactly once. Two "relays" (two asyncpg pools,
no push lanes) push to one vault at the same moment: the vault row lock alone keeps the
sequence dense and the counters exact. Then a relay is stopped in the middle of a
client's paging and a new one continues on the same database.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import asyncpg
import httpx
import pytest

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.domain.push_rules import check_structure
from engram_sync.relay.services.config import RelayConfig
from engram_sync.relay.store.push import PushJob, PushLimits, PushOutcome, Quota, push_group
from tests.relay.conftest import Relay, RelayThread, base_config
from tests.relay.support import (
    Sealer,
    client,
    new_vault_id,
    pull_ok,
    push_in_batches,
    push_ok,
    serve,
    versions,
    wait_for_lock_waiters,
)

#: The same tests on the Citus cluster too, by default (issue 18, tests/conftest.py).
pytestmark = pytest.mark.both_databases

PUSHERS = 20
BATCHES = 4
BATCH_SIZE = 8
PULLERS = 3

Version = tuple[str, int]


def test_concurrent_pushers_and_cursor_pullers(relay: Relay) -> None:
    vault = new_vault_id("busy")
    pushers_done = threading.Event()
    start = threading.Barrier(PUSHERS + PULLERS)

    def pusher(index: int) -> set[Version]:
        sealer = Sealer(vault)
        accepted: set[Version] = set()
        with client(relay) as http:
            start.wait()
            for batch in range(BATCHES):
                blobs = [
                    sealer.blob(f"p{index:02d}-b{batch}-{i}", batch * BATCH_SIZE + i + 1)
                    for i in range(BATCH_SIZE)
                ]
                if batch == 0:  # every pusher races for the same memory with the same clock
                    blobs.append(sealer.blob("contended", 1))
                answer = push_ok(http, vault, blobs)
                rejected = set(answer["rejected"])
                accepted |= {(b.memory_id, b.vector_clock) for b in blobs} - {
                    (b.memory_id, b.vector_clock) for b in blobs if b.memory_id in rejected
                }
                assert answer["accepted"] == len(blobs) - len(rejected)
        return accepted

    def puller() -> list[Version]:
        seen: list[Version] = []
        cursor = 0
        with client(relay) as http:
            start.wait()
            while True:
                quiet = pushers_done.is_set()  # read before the pull that may end the loop
                page = pull_ok(http, vault, cursor=cursor, limit=50)
                assert page["cursor"] >= cursor
                seen.extend(versions(page["blobs"]))
                cursor = page["cursor"]
                if not page["has_more"]:
                    if quiet:
                        return seen
                    time.sleep(0.002)  # pacing only; nothing depends on it

    with ThreadPoolExecutor(PUSHERS + PULLERS) as pool:
        pulls = [pool.submit(puller) for _ in range(PULLERS)]
        pushes = [pool.submit(pusher, i) for i in range(PUSHERS)]
        accepted: set[Version] = set()
        try:
            for future in pushes:
                accepted |= future.result(timeout=120)
        finally:
            pushers_done.set()
        seen_by = [future.result(timeout=120) for future in pulls]

    # Exactly one pusher won the contended memory (equal clocks: first writer wins).
    assert sum(1 for m, _ in accepted if m == "contended") == 1
    assert len(accepted) == PUSHERS * BATCHES * BATCH_SIZE + 1
    for seen in seen_by:
        duplicates = [v for v, n in Counter(seen).items() if n > 1]
        assert duplicates == []
        assert set(seen) == accepted
    # Sequence numbers are dense and equal the vault's counter: one per accepted blob.
    rows = relay.sql("SELECT seq FROM blobs WHERE vault_id = $1 ORDER BY seq", vault)
    assert [r["seq"] for r in rows] == list(range(1, len(accepted) + 1))
    (vault_row,) = relay.sql("SELECT seq FROM vaults WHERE vault_id = $1", vault)
    assert vault_row["seq"] == len(accepted)


RACERS = 8  # pushes per pool, all at once
ROUNDS = 3
RACE_LIMITS = PushLimits(max_blob_bytes=1_048_576, default_quota=Quota(0, 0))


def test_two_relays_pushing_one_vault_without_lanes(relay_config: RelayConfig) -> None:
    """2 x RACERS pushes from two pools (two replicas: no lane orders them) into one vault.

    A gate makes the race exact: the test holds SHARE on `blobs`, which lets every push
    read the vault and the blobs but not write, and opens only once all pushes wait on a
    lock. With the vault row lock (`FOR UPDATE` of `relay.store.push`) they wait for each
    other and commit one after the other; without it they all read the same `seq` and
    collide. Fails every run (5 of 5) with `FOR UPDATE OF v` removed."""
    vault = new_vault_id("replicas")
    sealer = Sealer(vault)
    name = f"race-{vault}"

    async def race() -> list[object]:
        url = to_libpq_url(relay_config.database_url)
        pools = [
            await asyncpg.create_pool(
                url,
                min_size=RACERS,
                max_size=RACERS,
                server_settings={"application_name": name},
            )
            for _ in range(2)
        ]
        gate = await asyncpg.connect(url)
        results: list[object] = []
        try:
            first = PushJob(vault, check_structure([sealer.blob("first", 1)], 1000), None)
            results += await push_group(pools[0], [first], RACE_LIMITS)  # creates the vault
            for round_ in range(ROUNDS):
                async with gate.transaction():
                    await gate.execute("LOCK TABLE blobs IN SHARE MODE")
                    pushes = []
                    for index in range(2 * RACERS):
                        blobs = [sealer.blob(f"r{round_}-p{index:02d}-{i}", 1) for i in range(3)]
                        push = PushJob(vault, check_structure(blobs, 1000), None)
                        pushes.append(
                            asyncio.ensure_future(push_group(pools[index % 2], [push], RACE_LIMITS))
                        )
                    await wait_for_lock_waiters(gate, name, 2 * RACERS)
                for outcome in await asyncio.gather(*pushes, return_exceptions=True):
                    results += outcome if isinstance(outcome, list) else [outcome]
        finally:
            await gate.close()
            for pool in pools:
                await pool.close()
        return results

    results = asyncio.run(race())
    failed = [r for r in results if not isinstance(r, PushOutcome)]
    assert failed == [], f"{len(failed)} of {len(results)} pushes failed: {failed[0]!r}"
    # The positive case: every push accepted all of its blobs, at distinct cursors.
    outcomes = [r for r in results if isinstance(r, PushOutcome)]
    assert [len(o.plan.accepted) for o in outcomes] == [1] + [3] * (ROUNDS * 2 * RACERS)
    total = 1 + 3 * ROUNDS * 2 * RACERS
    assert sorted(o.cursor for o in outcomes) == sorted({o.cursor for o in outcomes})
    assert max(o.cursor for o in outcomes) == total
    # No lost update: a dense sequence, and the vault's counters match its blobs.
    rows = relay_sql(relay_config, "SELECT seq, size_bytes FROM blobs WHERE vault_id = $1", vault)
    assert sorted(r["seq"] for r in rows) == list(range(1, total + 1))
    (counters,) = relay_sql(
        relay_config, "SELECT seq, live_blobs, bytes_used FROM vaults WHERE vault_id = $1", vault
    )
    assert tuple(counters) == (total, total, sum(r["size_bytes"] for r in rows))


def relay_sql(config: RelayConfig, query: str, *args: object) -> list[asyncpg.Record]:
    return Relay("", config.database_url, config).sql(query, *args)


@pytest.fixture
def restart_config(fresh_database_url: str) -> RelayConfig:
    return base_config(fresh_database_url)


def test_paging_survives_a_relay_restart(restart_config: RelayConfig) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    first_batch = sealer.blobs(250, prefix="before")
    later = sealer.blobs(30, prefix="after")
    seen: list[Version] = []

    first = RelayThread(restart_config).start()
    try:
        relay = Relay(first.url, restart_config.database_url, restart_config)
        with client(relay) as http:
            assert push_in_batches(http, vault, first_batch, batch=100) == 250
            page = pull_ok(http, vault, cursor=0, limit=100)
            assert page["has_more"] is True
            seen.extend(versions(page["blobs"]))
            cursor = page["cursor"]
    finally:
        first.stop()
    with httpx.Client(base_url=first.url) as http, pytest.raises(httpx.TransportError):
        http.get("/health")  # really gone

    with serve(restart_config) as second, client(second) as http:
        assert second.url != first.url
        assert push_ok(http, vault, later)["accepted"] == 30
        while True:
            page = pull_ok(http, vault, cursor=cursor, limit=100)
            seen.extend(versions(page["blobs"]))
            cursor = page["cursor"]
            if not page["has_more"]:
                break
    assert seen == [(b.memory_id, b.vector_clock) for b in first_batch + later]
    assert cursor == 280
