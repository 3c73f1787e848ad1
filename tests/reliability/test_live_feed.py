"""The live change feed across relay processes (PROTOCOL §15; issue 15 "Reliability"):
two `engram-relay serve` processes on one PostgreSQL, real HTTP, real NOTIFY.

- a push through one process wakes an event stream on the other;
- the LISTEN connection of a process killed (`pg_terminate_backend`, found by its
  application_name `engram-relay-listen <pid>`) comes back, and every stream still
  reaches the vault's head: 3 rounds here, 20 with --full;
- what committed while no connection listened is found by the re-read after the
  reconnect (a commit that sent no notification at all);
- the notification of a push arrives only once its blobs are visible to a pull;
- PostgreSQL restarted under open streams: they reach the head of a later push (1
  restart here, 5 with --full).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import asyncpg
import httpx
import pytest

from engram_sync.relay.db.embedded import EmbeddedPostgres
from engram_sync.relay.db.migrate import upgrade_to_head
from engram_sync.relay.db.url import to_libpq_url
from tests import tiers
from tests.relay.conftest import ADMIN_KEY, free_port
from tests.relay.sse import Message, messages, next_event
from tests.relay.support import (
    Sealer,
    new_device_id,
    new_vault_id,
    pull_ok,
    push_ok,
    run_db,
    wait_for,
)
from tests.reliability.support import RelayProcess, two_relay_processes

FULL = tiers.full()  # --full: the full sizes (tests/tiers.py)
ROUNDS = 20 if FULL else 3
PING_S = "0.5"


@pytest.fixture
def two_relays(fresh_database_url: str) -> Iterator[tuple[RelayProcess, RelayProcess]]:
    with two_relay_processes(fresh_database_url, {"ENGRAM_RELAY_EVENTS_PING_S": PING_S}) as pair:
        yield pair


def http(relay: RelayProcess) -> httpx.Client:
    return httpx.Client(
        base_url=relay.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30
    )


@contextmanager
def stream(
    relay: RelayProcess, vault: str, cursor: int, device: str
) -> Iterator[Iterator[Message]]:
    with (
        http(relay) as c,
        c.stream(
            "GET",
            f"/v1/vaults/{vault}/events",
            params={"cursor": cursor},
            headers={"X-Engram-Device": device},
        ) as response,
    ):
        assert response.status_code == 200, response.read()
        feed = messages(response)
        assert next(feed) == Message(retry=2000)
        yield feed


def listener_pids(relay: RelayProcess) -> list[int]:
    """Backend pids of the relay process's LISTEN connection (one when it is up)."""
    assert relay.proc is not None
    rows = run_db(
        relay.database_url,
        lambda conn: conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            f"engram-relay-listen {relay.proc.pid}",
        ),
    )
    return [r["pid"] for r in rows]


def listening(relay: RelayProcess) -> int:
    """The pid of the process's LISTEN connection, once there is exactly one."""
    pids: list[int] = []

    def one() -> bool:
        pids[:] = listener_pids(relay)
        return len(pids) == 1

    wait_for(one, "the relay's LISTEN connection")
    return pids[0]


def terminate(database_url: str, pid: int) -> None:
    assert run_db(database_url, lambda conn: conn.fetchval("SELECT pg_terminate_backend($1)", pid))


def reach(feed: Iterator[Message], head: int) -> None:
    """Read changes until one names `head` (each names a higher cursor than the last);
    bounded by the number of messages (pings every 0.5 s: 240 is two minutes)."""
    last = -1
    for _ in range(240):
        message = next_event(feed, skip_pings=False)
        if message.comment == "ping":
            continue
        assert message.event == "change", message
        cursor = message.json()["cursor"]
        assert cursor > last
        last = cursor
        if cursor >= head:
            assert cursor == head
            return
    raise AssertionError(f"the stream never reached {head} (last change {last})")


def test_a_push_through_one_relay_wakes_a_stream_on_the_other(
    two_relays: tuple[RelayProcess, RelayProcess],
) -> None:
    first, second = two_relays
    vault = new_vault_id()
    listening(first)
    sealer = Sealer(vault)
    with stream(first, vault, 0, new_device_id()) as feed, http(second) as pusher:
        for i in range(3):
            head = push_ok(pusher, vault, [sealer.blob(f"m{i}", 1)])["cursor"]
            reach(feed, head)
        assert head == 3


def test_listen_connection_killed_streams_still_reach_the_head(
    two_relays: tuple[RelayProcess, RelayProcess],
) -> None:
    first, second = two_relays
    vault = new_vault_id()
    sealer = Sealer(vault)
    with ExitStack() as held, http(second) as pusher:
        feeds = [held.enter_context(stream(first, vault, 0, new_device_id())) for _ in range(3)]
        for round_ in range(ROUNDS):
            old = listening(first)
            terminate(first.database_url, old)
            # Likely while the first process has no LISTEN connection: its hint is lost,
            # and the re-read after the reconnect must make up for it.
            head = push_ok(pusher, vault, [sealer.blob(f"round-{round_}", 1)])["cursor"]
            assert listening(first) != old  # it came back on a new connection
            for feed in feeds:
                reach(feed, head)
        assert head == ROUNDS


def test_a_commit_nobody_heard_is_found_after_the_reconnect(
    two_relays: tuple[RelayProcess, RelayProcess],
) -> None:
    first, _ = two_relays
    vault = new_vault_id()
    with http(first) as c:
        head = push_ok(c, vault, Sealer(vault).blobs(2))["cursor"]
    with stream(first, vault, head, new_device_id()) as feed:
        assert next(feed) == Message(comment="ping")
        # A commit that sends no notification at all (what a lost one looks like).
        run_db(
            first.database_url,
            lambda conn: conn.execute("UPDATE vaults SET seq = seq + 5 WHERE vault_id = $1", vault),
        )
        terminate(first.database_url, listening(first))
        reach(feed, head + 5)


def test_the_notification_comes_after_the_data_is_visible(fresh_database_url: str) -> None:
    relay = RelayProcess(fresh_database_url)
    relay.start()
    try:
        asyncio.run(_notified_after_commit(relay))
    finally:
        relay.stop()


async def _notified_after_commit(relay: RelayProcess) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    heard: asyncio.Queue[str] = asyncio.Queue()
    conn = await asyncpg.connect(to_libpq_url(relay.database_url))
    try:
        await conn.add_listener(
            "engram_vault_changes", lambda _c, _p, _ch, payload: heard.put_nowait(payload)
        )
        with http(relay) as c:
            for i in range(5):
                pushed = await asyncio.to_thread(
                    push_ok, c, vault, [sealer.blob(f"m{i}-{j}", 1) for j in range(3)]
                )
                payload = await asyncio.wait_for(heard.get(), timeout=60)
                assert payload == f"{vault} {pushed['cursor']}"  # one per vault per commit
                # Pulled the moment the notification arrived: the commit is visible.
                page = await asyncio.to_thread(pull_ok, c, vault, cursor=pushed["cursor"] - 3)
                assert [b["seq"] for b in page["blobs"]] == [
                    pushed["cursor"] - 2,
                    pushed["cursor"] - 1,
                    pushed["cursor"],
                ]
        assert heard.empty()  # no second notification for a commit
    finally:
        await conn.close()


RESTARTS = 5 if FULL else 1


@pytest.fixture
def own_postgres() -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of this test's own, so it can be stopped and started."""
    base = Path(tempfile.mkdtemp(prefix="engram-feed-pg-"))
    server = EmbeddedPostgres(base / "pg", port=free_port(), settings={"fsync": "off"})
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_streams_reach_the_head_after_a_database_restart(own_postgres: EmbeddedPostgres) -> None:
    """PostgreSQL stopped and started under open streams: the streams (idle, they hold no
    database connection) stay open, the LISTEN connection comes back by itself, and a push
    after the restart, through the other process, reaches every stream."""
    upgrade_to_head(own_postgres.url)
    env = {"ENGRAM_RELAY_EVENTS_PING_S": PING_S}
    first, second = RelayProcess(own_postgres.url, env=env), RelayProcess(own_postgres.url, env=env)
    first.start()
    second.start()
    try:
        vault = new_vault_id()
        sealer = Sealer(vault)
        with ExitStack() as held, http(second) as pusher:
            feeds = [held.enter_context(stream(first, vault, 0, new_device_id())) for _ in range(2)]
            for restart in range(RESTARTS):
                old = listening(first)
                own_postgres.stop()
                own_postgres.start()
                for relay in (first, second):
                    wait_for(lambda r=relay: ready(r), "the relay ready again")
                head = push_ok(pusher, vault, [sealer.blob(f"restart-{restart}", 1)])["cursor"]
                assert listening(first) != old
                for feed in feeds:
                    reach(feed, head)
            assert head == RESTARTS
    finally:
        first.stop()
        second.stop()


def ready(relay: RelayProcess) -> bool:
    try:
        return httpx.get(f"{relay.url}/ready", timeout=5).status_code == 200
    except httpx.TransportError:
        return False
