"""ENGRAM_RELAY_LIVE_FEED (PROTOCOL §15): the live change feed on, long-poll only, or off,
over real HTTP on a real relay and PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import asyncpg
import httpx
import pytest

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.services.config import RelayConfig, config_from_env
from tests.relay.conftest import Relay
from tests.relay.support import Sealer, client, new_device_id, new_vault_id, pull_ok, push_ok

CHANNEL = "engram_vault_changes"


@pytest.fixture
def relay_config(relay_config: RelayConfig, request: pytest.FixtureRequest) -> RelayConfig:
    return replace(relay_config, live_feed=request.param)


def features(http: httpx.Client) -> set[str]:
    answer = http.get("/v1/info")
    assert answer.status_code == 200
    return set(answer.json()["features"])


def events_status(http: httpx.Client, vault: str) -> int:
    with http.stream(
        "GET", f"/v1/vaults/{vault}/events", params={"cursor": 0},
        headers={"X-Engram-Device": new_device_id()},
    ) as response:  # fmt: skip
        return response.status_code


def notifications_of_a_push(relay: Relay, http: httpx.Client, vault: str) -> list[str]:
    """The NOTIFY payloads a listener of our own hears for one push, the vault's first.

    The relay answers a push at its commit and sends the NOTIFY after (issue 36), so a
    sentinel sent on the first answer could overtake it. A second push to the vault goes
    to the same lane of the one relay process, and a lane runs its next group only after
    the previous group's NOTIFY: a sentinel sent on the second answer comes after the
    first push's NOTIFY. The second push's own may come either side of it; it is dropped.
    """

    async def go() -> list[str]:
        heard: list[str] = []
        sentinel = asyncio.Event()

        def on_notify(_c: object, _p: int, _ch: str, payload: str) -> None:
            if payload == "sentinel":
                sentinel.set()
            elif not sentinel.is_set():
                heard.append(payload)

        conn = await asyncpg.connect(to_libpq_url(relay.database_url))
        other = await asyncpg.connect(to_libpq_url(relay.database_url))
        try:
            await conn.add_listener(CHANNEL, on_notify)
            sealer = Sealer(vault)
            for head in (1, 2):
                blobs = sealer.blobs(1, prefix=f"mem{head}")
                answer = await asyncio.to_thread(push_ok, http, vault, blobs)
                assert answer["cursor"] == head
            await other.execute(f"NOTIFY {CHANNEL}, 'sentinel'")
            await asyncio.wait_for(sentinel.wait(), timeout=60)
        finally:
            await other.close()
            await conn.close()
        return [payload for payload in heard if payload != f"{vault} 2"]

    return asyncio.run(go())


@pytest.mark.parametrize("relay_config", ["on"], indirect=True)
def test_on_serves_events_long_poll_and_notify(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id()
    assert {"events", "events-blobs", "pull-wait"} <= features(http)
    assert events_status(http, vault) == 200
    assert notifications_of_a_push(relay, http, vault) == [f"{vault} 1"]


@pytest.mark.parametrize("relay_config", ["long-poll"], indirect=True)
def test_long_poll_serves_no_event_stream(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id()
    listed = features(http)
    assert "pull-wait" in listed
    assert not {"events", "events-blobs"} & listed
    assert events_status(http, vault) == 404
    assert notifications_of_a_push(relay, http, vault) == [f"{vault} 1"]


@pytest.mark.parametrize("relay_config", ["off"], indirect=True)
def test_off_sends_no_notify_and_answers_a_wait_at_once(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id()
    listed = features(http)
    assert not {"events", "events-blobs", "pull-wait"} & listed
    assert "cursor" in listed  # the rest of the list is intact
    assert events_status(http, vault) == 404
    assert notifications_of_a_push(relay, http, vault) == []
    with client(relay) as c:  # 30 s read timeout
        # Nothing past 2 and wait=60: held, the read would time out; an ordinary pull here.
        page = pull_ok(c, vault, cursor=2, wait=60)
        assert page["blobs"] == []
    rows = relay_listeners(relay.database_url)
    assert rows == 0  # no LISTEN connection


def relay_listeners(database_url: str) -> int:
    async def go() -> int:
        conn = await asyncpg.connect(to_libpq_url(database_url))
        try:
            count: int = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name LIKE 'engram-relay-listen%'"
                " AND datname = current_database()"
            )
            return count
        finally:
            await conn.close()

    return asyncio.run(go())


@pytest.mark.parametrize("relay_config", ["on"], indirect=True)
def test_on_has_a_listen_connection(relay: Relay) -> None:
    deadline = time.monotonic() + 30
    while relay_listeners(relay.database_url) != 1:
        assert time.monotonic() < deadline, "no LISTEN connection"
        time.sleep(0.05)


def test_the_setting_is_read_from_the_environment(fresh_database_url: str) -> None:
    url = fresh_database_url
    assert config_from_env(url, {}).live_feed == "on"
    assert config_from_env(url, {"ENGRAM_RELAY_LIVE_FEED": " Off "}).live_feed == "off"
    assert config_from_env(url, {"ENGRAM_RELAY_LIVE_FEED": "long-poll"}).feed_notify
    assert not config_from_env(url, {"ENGRAM_RELAY_LIVE_FEED": "long-poll"}).feed_events
    with pytest.raises(ValueError, match="ENGRAM_RELAY_LIVE_FEED must be one of on, long-poll"):
        config_from_env(url, {"ENGRAM_RELAY_LIVE_FEED": "maybe"})
