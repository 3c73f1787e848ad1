"""Chaos under the live change feed (PROTOCOL §15; issue 15 "Reliability"): two
`engram-relay serve --workers 2` processes on one PostgreSQL of the test's own, real HTTP,
real NOTIFY/LISTEN, and feed-only devices on both replicas.

A feed-only device syncs only through the feed: it holds an event stream from its own
cursor and, on each `change` hint past that cursor, pulls pages until there are no more,
keeping every blob it was given; when the stream breaks it opens a new one from its
cursor after 0.2 s. It never pulls on a timer, so a hint that is lost for good would
leave it behind the head.

Each fault is repeated 3 times (the issue's 20 with `--full`, tests/tiers.py):

- every LISTEN connection terminated (`pg_terminate_backend`), and each new one too as
  soon as it shows, while a push commits and for 0.3 s after: its notification reaches
  no process but the pushing one's own hub, so only the re-read after the reconnect
  brings the other devices to the head (timed from the end of that hold);
- PostgreSQL stopped and started under the open streams, then a push once it is back;
- one worker of a relay process killed (SIGKILL; uvicorn's supervisor starts another),
  then a push through that process.

After each round every device reaches the vault's head, and its blobs are exactly the
relay's (a full pull from 0): nothing is missed. Nothing is timed in an assertion (a
generous bound only); the seconds from the push's answer to the last device at the head
are printed (`-s`) and written to ENGRAM_FEED_CHAOS_FIGURES (a JSON file) when set:
RELIABILITY.md §13 has the figures of a 20-round run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path

import httpx
import psutil
import pytest

from engram_sync.client._http.sse import SseEvent, SseParser
from engram_sync.relay.db.embedded import EmbeddedPostgres
from engram_sync.relay.db.migrate import upgrade_to_head
from tests import tiers
from tests.relay.conftest import ADMIN_KEY, free_port
from tests.relay.support import Sealer, new_device_id, new_vault_id, push, run_db
from tests.reliability.support import RelayProcess

ROUNDS = 20 if tiers.full() else 3
FIGURES = os.environ.get("ENGRAM_FEED_CHAOS_FIGURES")
DEVICES_PER_REPLICA = 3
WORKERS = 2
REACH_BOUND_S = 120.0  # a liveness bound, not a timing figure
RECONNECT_S = 0.2
# pytest-timeout's 600 s is short for 20 rounds on a loaded machine (a killed worker's
# replacement took 20-30 s to start at load 18)
CHAOS_TIMEOUT = pytest.mark.timeout(max(600, 120 * ROUNDS))


class FeedOnlyDevice:
    """A device that learns of changes only from the event stream (see the module doc)."""

    def __init__(self, relay: RelayProcess, vault: str) -> None:
        self.relay, self.vault = relay, vault
        self.device_id = new_device_id()
        self.cursor = 0
        self.blobs: dict[int, str] = {}  # seq -> memory_id of every blob it pulled
        self.streams = 0
        self.hints = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> FeedOnlyDevice:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def at(self) -> tuple[int, dict[int, str]]:
        with self._lock:
            return self.cursor, dict(self.blobs)

    def _client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.relay.url,
            headers={"Authorization": f"Bearer {ADMIN_KEY}", "X-Engram-Device": self.device_id},
            timeout=httpx.Timeout(10.0, read=5.0),  # pings every 0.5 s: 5 s silent is dead
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._client() as http:
                    self._stream(http)
            except (httpx.HTTPError, ValueError, KeyError):
                pass  # the stream (or a pull) broke: a new stream from the cursor
            self._stop.wait(RECONNECT_S)

    def _stream(self, http: httpx.Client) -> None:
        with http.stream(
            "GET", f"/v1/vaults/{self.vault}/events", params={"cursor": self.cursor}
        ) as response:
            if response.status_code != 200:
                return
            self.streams += 1
            parser = SseParser()
            for chunk in response.iter_bytes():
                for item in parser.feed(chunk):
                    if isinstance(item, SseEvent) and item.event == "change":
                        self.hints += 1
                        if json.loads(item.data)["cursor"] > self.cursor:
                            self._catch_up(http)
                if self._stop.is_set():
                    return

    def _catch_up(self, http: httpx.Client) -> None:
        while True:
            answer = http.get(
                f"/v1/vaults/{self.vault}/pull", params={"cursor": self.cursor, "limit": 1000}
            )
            if answer.status_code != 200:
                raise ValueError(f"pull answered {answer.status_code}")
            page = answer.json()
            with self._lock:
                for blob in page["blobs"]:
                    self.blobs[blob["seq"]] = blob["memory_id"]
                self.cursor = page["cursor"]
            if not page["has_more"]:
                return


@pytest.fixture
def own_postgres() -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of this test's own, so it can be stopped and started."""
    base = Path(tempfile.mkdtemp(prefix="engram-chaos-pg-"))
    server = EmbeddedPostgres(base / "pg", port=free_port(), settings={"fsync": "off"})
    server.start()
    try:
        upgrade_to_head(server.url)
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


class Cluster:
    """Two relay processes of WORKERS workers each, a vault, devices on both, a pusher."""

    def __init__(self, database_url: str, held: ExitStack) -> None:
        env = {"ENGRAM_RELAY_EVENTS_PING_S": "0.5"}
        self.database_url = database_url
        self.relays = [
            RelayProcess(
                database_url, env=env, args=("--workers", str(WORKERS)), start_timeout_s=300
            )
            for _ in range(2)
        ]
        for relay in self.relays:
            relay.start()
            held.callback(relay.stop)
            wait_until(lambda r=relay: len(workers(r)) == WORKERS, "every worker listening")
        wait_until(lambda: len(listener_pids(database_url)) == 2 * WORKERS, "every LISTEN")
        self.vault = new_vault_id()
        self.sealer = Sealer(self.vault)
        self.pushes = 0
        self.devices = [
            FeedOnlyDevice(relay, self.vault).start()
            for relay in self.relays
            for _ in range(DEVICES_PER_REPLICA)
        ]
        for device in self.devices:
            held.callback(device.stop)
        wait_until(lambda: all(d.streams for d in self.devices), "every device's first stream")
        self.figures: list[float] = []

    def push(self, through: RelayProcess) -> tuple[int, float]:
        """One new blob through `through`, retried until the relay takes it (it may be
        recovering); returns (the vault's head, the moment of the answer)."""
        blob = self.sealer.blob(f"chaos-{self.pushes}", 1)
        self.pushes += 1
        deadline = time.monotonic() + REACH_BOUND_S
        with httpx.Client(
            base_url=through.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10
        ) as http:
            while True:
                try:
                    answer = push(http, self.vault, [blob])
                    if answer.status_code == 200:
                        return int(answer.json()["cursor"]), time.monotonic()
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the relay never took the push"
                time.sleep(0.05)

    def all_reach(self, head: int, since: float) -> float:
        """Wait (bounded) until every device is at `head`; the seconds since `since`; then
        every device's blobs are the relay's."""
        deadline = time.monotonic() + REACH_BOUND_S
        while not all(d.at()[0] >= head for d in self.devices):
            behind = [(d.device_id[:8], d.at()[0]) for d in self.devices if d.at()[0] < head]
            assert time.monotonic() < deadline, f"devices never reached {head}: {behind}"
            time.sleep(0.005)
        took = time.monotonic() - since
        self.figures.append(took)
        relay_blobs = self.relay_blobs()
        assert max(relay_blobs) == head
        for device in self.devices:
            cursor, blobs = device.at()
            assert cursor == head
            assert blobs == relay_blobs, f"device {device.device_id} missed blobs"
        return took

    def relay_blobs(self) -> dict[int, str]:
        """Every blob of the vault as the relay has it (a full pull from 0)."""
        found: dict[int, str] = {}
        cursor = 0
        with httpx.Client(
            base_url=self.relays[0].url, headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=30,
        ) as http:  # fmt: skip
            while True:
                page = http.get(f"/v1/vaults/{self.vault}/pull", params={"cursor": cursor}).json()
                found.update({b["seq"]: b["memory_id"] for b in page["blobs"]})
                cursor = page["cursor"]
                if not page["has_more"]:
                    return found


def wait_until(condition: Callable[[], bool], what: str, every: float = 0.05) -> None:
    """Poll `condition` until it holds, up to REACH_BOUND_S (a loaded machine starts and
    restarts workers slowly: tests.relay.support.wait_for's 60 s was passed at load 20)."""
    deadline = time.monotonic() + REACH_BOUND_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(every)


def workers(relay: RelayProcess) -> list[int]:
    """The pids of the relay's worker processes that listen on its port."""
    assert relay.proc is not None
    pids = []
    for child in psutil.Process(relay.proc.pid).children(recursive=True):
        try:
            conns = child.net_connections("tcp")
        except psutil.Error:
            continue
        if any(c.status == "LISTEN" and c.laddr.port == relay.port for c in conns):
            pids.append(child.pid)
    return pids


def listener_pids(database_url: str) -> list[int]:
    """Backend pids of every relay worker's LISTEN connection."""
    rows = run_db(
        database_url,
        lambda conn: conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'engram-relay-listen %'"
        ),
    )
    return [r["pid"] for r in rows]


def report(name: str, figures: list[float]) -> None:
    line = {
        "fault": name,
        "rounds": len(figures),
        "max_s": round(max(figures), 3),
        "p50_s": round(statistics.median(figures), 3),
        "all_s": [round(f, 3) for f in figures],
    }
    print(f"\nlive feed chaos: {json.dumps(line)}")
    if FIGURES:
        with open(FIGURES, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


Fault = Callable[["Cluster", int], tuple[RelayProcess, AbstractContextManager[object]]]


def chaos(own_postgres: EmbeddedPostgres, name: str, fault: Fault) -> None:
    """ROUNDS rounds of: the fault; one push through the relay it names, inside the
    window it gives; every device at the head (timed from the push's answer, or from the
    window's end when that is later) with the relay's blobs."""
    with ExitStack() as held:
        cluster = Cluster(own_postgres.url, held)
        for round_ in range(ROUNDS):
            through, window = fault(cluster, round_)
            with window:
                head, answered = cluster.push(through)
            cluster.all_reach(head, max(answered, time.monotonic()))
        assert cluster.pushes == ROUNDS
        report(name, cluster.figures)


def terminate_listeners(database_url: str) -> list[int]:
    """pg_terminate_backend of every relay LISTEN connection; the pids terminated."""
    rows = run_db(
        database_url,
        lambda conn: conn.fetch(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name LIKE 'engram-relay-listen %'"
        ),
    )
    return [r["pid"] for r in rows]


@contextmanager
def listeners_held_down(database_url: str, hold_after_s: float = 0.3) -> Iterator[None]:
    """Every LISTEN connection terminated, and each new one terminated as soon as it
    shows, until `hold_after_s` after the block: a notification sent meanwhile reaches no
    relay process but the pushing one's own hub, so only the re-read after the reconnect
    (relay.services.feed_listener) brings the other devices to the head."""
    done = threading.Event()
    terminated: list[int] = []

    def keep_terminating() -> None:
        while not done.is_set():
            terminated.extend(terminate_listeners(database_url))
            done.wait(0.01)

    thread = threading.Thread(target=keep_terminating, daemon=True)
    thread.start()
    try:
        wait_until(lambda: bool(terminated), "a LISTEN connection terminated")
        yield
        time.sleep(hold_after_s)
    finally:
        done.set()
        thread.join(timeout=30)


@CHAOS_TIMEOUT
def test_listen_connections_terminated(own_postgres: EmbeddedPostgres) -> None:
    def fault(cluster: Cluster, round_: int) -> tuple[RelayProcess, AbstractContextManager[object]]:
        url = cluster.database_url
        wait_until(lambda: len(listener_pids(url)) == 2 * WORKERS, "every LISTEN connection")
        return cluster.relays[round_ % 2], listeners_held_down(url)

    chaos(own_postgres, "pg_terminate_backend of every LISTEN connection", fault)


@CHAOS_TIMEOUT
def test_postgres_restarted(own_postgres: EmbeddedPostgres) -> None:
    def fault(cluster: Cluster, round_: int) -> tuple[RelayProcess, AbstractContextManager[object]]:
        own_postgres.stop()
        own_postgres.start()
        return cluster.relays[round_ % 2], nullcontext()

    chaos(own_postgres, "PostgreSQL restarted", fault)


@CHAOS_TIMEOUT
def test_a_relay_worker_killed(own_postgres: EmbeddedPostgres) -> None:
    def fault(cluster: Cluster, round_: int) -> tuple[RelayProcess, AbstractContextManager[object]]:
        relay = cluster.relays[round_ % 2]
        before = workers(relay)
        assert len(before) == WORKERS
        victim = before[round_ % WORKERS]
        os.kill(victim, signal.SIGKILL)
        wait_until(  # uvicorn's supervisor starts a new worker in its place
            lambda: len(now := workers(relay)) == WORKERS and victim not in now,
            "a new worker in the killed one's place",
            every=0.5,  # psutil reads every socket of the machine: not too often
        )
        return relay, nullcontext()

    chaos(own_postgres, "a relay worker killed (SIGKILL)", fault)
