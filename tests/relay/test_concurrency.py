"""Commit-ordered cursors under concurrency and across a relay restart (PROTOCOL §6, §9).

20 pushers (threads, each with its own HTTP client) and 3 cursor pullers on one vault:
every accepted blob reaches every puller exactly once. Then a relay is stopped in
the middle of a client's paging and a new one continues on the same database.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from relay.config import RelayConfig
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
)

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
