"""A key's rate limit holds across relay processes (issue 18, deploy/SCALING.md §1).

Two real `engram-relay serve` processes on one PostgreSQL: each counts the live processes
from their heartbeats (relay.store.replicas) and enforces rate/N of the key, so the sum
of what both accept stays near the key's rate; once one is killed and its heartbeat
expires, the other alone gets the full rate and burst again. Only counting bounds: a
token bucket accepts at most burst + rate x elapsed, whatever the machine's speed.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.relay.conftest import METRICS_TOKEN, Relay
from tests.reliability.support import RelayProcess, two_relay_processes

RATE = 10  # requests/second of the key (burst = rate, PROTOCOL §5)
WINDOW_S = 3.0
SLACK = 3  # requests that straddle a bucket update or the window's edges
VAULT = "rate-shared"
REFRESH_S = "0.3"  # ENGRAM_RELAY_HEALTH_REFRESH_S: heartbeats expire after 0.9 s


@pytest.fixture
def two_relays(fresh_database_url: str) -> Iterator[tuple[RelayProcess, RelayProcess]]:
    with two_relay_processes(
        fresh_database_url, {"ENGRAM_RELAY_HEALTH_REFRESH_S": REFRESH_S}
    ) as pair:
        yield pair


def _processes_seen(relay: RelayProcess) -> int:
    text = httpx.get(
        f"{relay.url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=30
    ).text
    found = re.search(r"^engram_relay_processes ([0-9.]+)$", text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


def _wait_until_seen(relay: RelayProcess, processes: int) -> None:
    deadline = time.monotonic() + 120  # a bound on waiting, not an assertion on speed
    while _processes_seen(relay) != processes:
        assert time.monotonic() < deadline, f"{relay.url} never counted {processes} processes"
        time.sleep(0.1)


def _hammer(relays: list[RelayProcess], key: str, threads_each: int) -> tuple[list[int], float]:
    """Requests of `key` as fast as `threads_each` threads per relay can send them for
    WINDOW_S; the accepted ones per relay and the seconds from first send to last answer."""
    accepted = [0] * len(relays)
    lock = threading.Lock()
    errors: list[BaseException] = []
    started = time.monotonic()
    stop_at = started + WINDOW_S

    def run(index: int) -> None:
        try:
            with httpx.Client(
                base_url=relays[index].url, headers={"Authorization": f"Bearer {key}"}, timeout=60
            ) as client:
                while time.monotonic() < stop_at:
                    response = client.get(f"/v1/vaults/{VAULT}/pull", params={"cursor": 0})
                    assert response.status_code in (200, 429), response.text
                    if response.status_code == 200:
                        with lock:
                            accepted[index] += 1
        except BaseException as exc:
            errors.append(exc)

    workers = [
        threading.Thread(target=run, args=(i,))
        for i in range(len(relays))
        for _ in range(threads_each)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    assert not errors, errors[:3]
    return accepted, time.monotonic() - started


def test_one_keys_rate_holds_across_two_relay_processes(
    two_relays: tuple[RelayProcess, RelayProcess],
) -> None:
    first, second = two_relays
    key = Relay(first.url, first.database_url, None).mint(VAULT, rate=RATE)  # type: ignore[arg-type]
    _wait_until_seen(first, 2)
    _wait_until_seen(second, 2)

    accepted, elapsed = _hammer([first, second], key, threads_each=2)
    # Each process: at most rate/2 tokens at the start plus rate/2 a second: the sum is one
    # key's burst + rate x elapsed (per process, unshared, it would be twice that).
    assert sum(accepted) <= RATE * elapsed + RATE + SLACK, (accepted, elapsed)
    assert all(count > 0 for count in accepted), accepted

    # The positive case: the other process is gone (killed: no clean leave, its heartbeat
    # expires), and the survivor alone gets the key's full burst and rate again.
    second.kill()
    _wait_until_seen(first, 1)
    time.sleep(1.2)  # idle: the bucket refills to its burst (a wait, not an assertion)
    with httpx.Client(base_url=first.url, headers={"Authorization": f"Bearer {key}"}) as client:
        burst = [client.get(f"/v1/vaults/{VAULT}/pull").status_code for _ in range(RATE)]
    assert burst == [200] * RATE  # shared by two it holds 5 tokens and refills 5/s

    alone, elapsed = _hammer([first], key, threads_each=4)
    # More than half the rate could ever give (rate/2 x elapsed + burst/2), and no more
    # than the whole key's rate.
    assert RATE / 2 * elapsed + RATE / 2 + SLACK < alone[0] <= RATE * elapsed + RATE + SLACK, (
        alone,
        elapsed,
    )


def test_each_worker_of_one_serve_counts_as_a_process(fresh_database_url: str) -> None:
    """`--workers 2`: every worker is its own app with its own buckets, so it registers
    itself and the rates are shared by two (the table names both, with their pids)."""
    relay = RelayProcess(
        fresh_database_url,
        env={"ENGRAM_RELAY_HEALTH_REFRESH_S": REFRESH_S},
        args=("--workers", "2"),
        start_timeout_s=120,
    )
    relay.start()
    try:
        _wait_until_seen(relay, 2)
        rows = Relay(relay.url, relay.database_url, None).sql(  # type: ignore[arg-type]
            "SELECT label FROM relay_processes WHERE expires_at > now()"
        )
        assert len({row["label"] for row in rows}) == 2, rows
    finally:
        relay.stop()
