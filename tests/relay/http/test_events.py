"""The live change feed's event stream, `GET /v1/vaults/{v}/events` (PROTOCOL §15), over
real HTTP on a real relay and PostgreSQL: retry first, a change at once when the cursor
is behind, a change after a push, pings, `revoked` and the end for a revoked device,
auth as pull, 400 for a bad cursor, 503 `busy` over the cap."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace

import httpx
import pytest
import uvicorn

from engram_sync.relay.serving.app import create_app
from engram_sync.relay.serving.connections import ConnectionLimits, GuardedConfig
from tests.relay.conftest import ADMIN_KEY, Relay, base_config, free_port
from tests.relay.sse import Message, messages, next_event
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    migrated_database,
    module_relay_fixture,
    new_device_id,
    new_vault_id,
    pull_ok,
    push_ok,
    serve,
    wait_for,
)

PING_S = 0.2
relay = module_relay_fixture(events_ping_s=PING_S)


@contextmanager
def stream(
    relay: Relay, vault: str, cursor: object, *, key: str = ADMIN_KEY, device: str | None = None
) -> Iterator[httpx.Response]:
    headers = {"X-Engram-Device": device} if device else {}
    with (
        client(relay, key) as http,
        http.stream(
            "GET", f"/v1/vaults/{vault}/events", params={"cursor": cursor}, headers=headers
        ) as response,
    ):
        yield response


def opened(response: httpx.Response) -> Iterator[Message]:
    """The stream's messages after checking the answer and its first message."""
    assert response.status_code == 200, response.read()
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    feed = messages(response)
    first = next(feed)
    assert first == Message(retry=2000), first
    return feed


def test_a_cursor_behind_gets_a_change_at_once(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id()
    head = push_ok(http, vault, Sealer(vault).blobs(3))["cursor"]
    with stream(relay, vault, 0) as response:
        change = next_event(opened(response))
    assert change.event == "change"
    assert change.json() == {"cursor": head}
    assert head == 3


def test_a_cursor_at_the_head_gets_only_pings(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id()
    head = push_ok(http, vault, Sealer(vault).blobs(3))["cursor"]
    with stream(relay, vault, head) as response:
        feed = opened(response)
        # Three messages, each a ping (every PING_S): no change for a cursor at the head.
        assert [next(feed) for _ in range(3)] == [Message(comment="ping")] * 3


def test_a_push_wakes_the_stream(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    with stream(relay, vault, 0) as response:
        feed = opened(response)
        first = push_ok(http, vault, sealer.blobs(2))["cursor"]
        assert next_event(feed).json() == {"cursor": first}
        second = push_ok(http, vault, [sealer.blob("another", 1)])["cursor"]
        change = next_event(feed)
    assert change.event == "change"
    assert change.json() == {"cursor": second}
    assert second == first + 1 == 3
    # The hint names a cursor a pull then reaches: the blobs themselves come by pull.
    assert pull_ok(http, vault, cursor=0)["cursor"] == second


def test_a_push_to_another_vault_does_not_wake_it(relay: Relay, http: httpx.Client) -> None:
    vault, other = new_vault_id(), new_vault_id()
    with stream(relay, vault, 0) as response:
        feed = opened(response)
        push_ok(http, other, Sealer(other).blobs(1))
        assert next(feed) == Message(comment="ping")
        head = push_ok(http, vault, Sealer(vault).blobs(1))["cursor"]
        assert next_event(feed).json() == {"cursor": head}


def test_a_revoked_device_gets_revoked_and_the_stream_ends(
    relay: Relay, http: httpx.Client
) -> None:
    vault, device = new_vault_id(), new_device_id()
    key = relay.mint(vault, device_id=device)
    sealer = Sealer(vault)
    push_ok(client(relay, key), vault, [sealer.blob("m", 1, device_id=device)])
    with stream(relay, vault, 1, key=key) as response:
        feed = opened(response)
        assert next(feed) == Message(comment="ping")  # alive until the revocation
        revoked = http.delete(f"/v1/vaults/{vault}/devices/{device}")
        assert revoked.status_code == 200, revoked.text
        message = next_event(feed)
        assert message.event == "revoked"
        assert message.json()["code"] == "device_revoked"
        assert list(feed) == []  # and then the stream ends
    # A new stream of that key is refused as its pull is (PROTOCOL §10).
    with stream(relay, vault, 0, key=key) as response:
        response.read()
        assert_error(response, 403, "device_revoked")


def test_a_device_named_by_header_gets_revoked_too(relay: Relay, http: httpx.Client) -> None:
    vault, device, other = new_vault_id(), new_device_id(), new_device_id()
    push_ok(http, vault, Sealer(vault).blobs(1))
    with (
        stream(relay, vault, 1, device=device) as mine,
        stream(relay, vault, 1, device=other) as theirs,
    ):
        feed, other_feed = opened(mine), opened(theirs)
        assert http.delete(f"/v1/vaults/{vault}/devices/{device}").status_code == 200
        assert next_event(feed).event == "revoked"
        assert list(feed) == []
        # The other device's stream of the same vault goes on.
        head = push_ok(http, vault, [Sealer(vault).blob("after", 1)])["cursor"]
        assert next_event(other_feed).json() == {"cursor": head}


def test_an_open_stream_of_a_vault_being_retired_says_retired_and_ends(
    relay: Relay, http: httpx.Client
) -> None:
    """PROTOCOL §19: the retire, through another connection, wakes a stream opened before
    it; the stream sends the pull's `retired` JSON and ends. A revocation of another
    device does not end the live vault's stream."""
    vault, successor, device, other = (
        new_vault_id("ret-open"), new_vault_id("ret-next"), new_device_id(), new_device_id()
    )  # fmt: skip
    key = relay.mint(vault, device_id=device)
    push_ok(client(relay, key), vault, [Sealer(vault).blob("m", 1, device_id=device)])
    with stream(relay, vault, 1, key=key) as response:
        feed = opened(response)
        assert next(feed) == Message(comment="ping")
        # the positive case: a revocation of another device wakes the stream, which stays
        assert http.delete(f"/v1/vaults/{vault}/devices/{other}").status_code == 200
        assert next(feed) == Message(comment="ping")
        head = push_ok(client(relay, key), vault, [Sealer(vault).blob("n", 2, device_id=device)])
        assert next_event(feed).json() == {"cursor": head["cursor"]}
        retired = http.post(f"/v1/vaults/{vault}/retire", json={"successor": successor})
        assert retired.status_code == 200, retired.text
        message = next_event(feed)
        assert message.event == "retired"
        assert message.json() == {
            "successor": successor,
            "erase_after": retired.json()["erase_after"],
        }
        assert list(feed) == []  # and then the stream ends


def test_auth_is_as_pull(relay: Relay) -> None:
    vault = new_vault_id()
    other_key = relay.mint(new_vault_id())
    with stream(relay, vault, 0, key="unknown-key-0123456789abcdef") as response:
        response.read()
        assert_error(response, 401)
    with stream(relay, vault, 0, key=other_key) as response:
        response.read()
        assert_error(response, 403)
    with client(relay, None) as anonymous:
        assert_error(anonymous.get(f"/v1/vaults/{vault}/events", params={"cursor": 0}), 401)
    with stream(relay, vault, 0, key=relay.mint(vault)) as response:
        opened(response)  # the positive case: a key of the vault streams


@pytest.mark.parametrize("cursor", ["-1", "abc", str(2**63), ""])
def test_a_bad_cursor_is_400_naming_it(http: httpx.Client, cursor: str) -> None:
    response = http.get(f"/v1/vaults/{new_vault_id()}/events", params={"cursor": cursor})
    body = assert_error(response, 400, "invalid_request")
    assert body["field"] == "cursor", body


def test_a_missing_cursor_is_400_naming_it(http: httpx.Client) -> None:
    body = assert_error(http.get(f"/v1/vaults/{new_vault_id()}/events"), 400, "invalid_request")
    assert body["field"] == "cursor", body


def test_streams_over_the_cap_are_refused_busy(postgres_url: str) -> None:
    config = replace(base_config("unused"), events_ping_s=PING_S, events_max_streams=2)
    with migrated_database(postgres_url) as url, serve(replace(config, database_url=url)) as r:
        vault = new_vault_id()
        with ExitStack() as held:
            # Kept referenced: a dropped message iterator closes its response.
            feeds = [opened(held.enter_context(stream(r, vault, 0))) for _ in range(2)]
            with stream(r, vault, 0) as refused:
                refused.read()
                assert_error(refused, 503, "busy")
                assert refused.headers["retry-after"] == "5"
            with client(r) as http:  # a long-poll takes a place too
                assert_error(
                    http.get(f"/v1/vaults/{vault}/pull", params={"cursor": 0, "wait": 1}), 503
                )
            assert [next(feed) for feed in feeds] == [Message(comment="ping")] * 2

        # Closed streams give their places back (once the relay saw the disconnects).
        def reopens() -> bool:
            with stream(r, vault, 0) as again:
                if again.status_code == 503:
                    return False
                assert next(opened(again)) == Message(comment="ping")
                return True

        wait_for(reopens, "a closed stream's place to be given back", every=0.1)


def pool_activity(relay: Relay) -> list[tuple[int, object]]:
    """(backend pid, start of its last query) of every pooled relay connection: a query
    of the relay moves one of them (pg_stat_activity is live, not flushed later)."""
    rows = relay.sql(
        "SELECT pid, query_start FROM pg_stat_activity"
        " WHERE application_name = 'engram-relay' AND datname = current_database()"
        " ORDER BY pid"
    )
    return [(r["pid"], r["query_start"]) for r in rows]


def test_idle_streams_send_no_query(postgres_url: str) -> None:
    """PROTOCOL §15: an idle subscriber costs no database query. 20 streams of two vaults
    (minted keys and a device header, so the revocable kind) over three ping intervals
    leave every pooled connection's last query where it was; a pull then moves one (the
    measure sees queries)."""
    config = replace(
        base_config("unused"),
        events_ping_s=PING_S,
        health_refresh_secs=3600,  # its one round runs at start-up
        maintenance_interval_secs=0,
        events_max_per_key=10,  # ten streams of each vault's key (relay.domain.stream_holders)
    )
    with migrated_database(postgres_url) as url, serve(replace(config, database_url=url)) as r:
        vaults = [new_vault_id(), new_vault_id()]
        keys = {v: r.mint(v) for v in vaults}
        with client(r) as http, ExitStack() as held:
            heads = {v: push_ok(http, v, Sealer(v).blobs(2))["cursor"] for v in vaults}
            feeds = []
            for i in range(20):
                v = vaults[i % 2]
                feed = opened(held.enter_context(stream(r, v, 0, key=keys[v], device=f"d{i}")))
                assert next_event(feed).json() == {"cursor": heads[v]}  # its start-up read
                feeds.append(feed)
            before = pool_activity(r)
            for feed in feeds:
                assert [next(feed) for _ in range(3)] == [Message(comment="ping")] * 3
            after = pool_activity(r)
            assert before == after
            assert before  # there are pooled connections to watch
            pull_ok(http, vaults[0], cursor=0)
            assert pool_activity(r) != after


def test_every_stream_gets_its_own_response_headers(relay: Relay) -> None:
    """The stream's start message is built anew for each stream: the request-id
    middleware adds its header to the message it is given, and a shared one would carry
    every earlier stream's id too (found by the 10,000-stream bench)."""
    vault = new_vault_id()
    ids = []
    for _ in range(3):
        with stream(relay, vault, 0) as response:
            opened(response)
            ids.append(response.headers.get_list("x-request-id"))
    assert [len(found) for found in ids] == [1, 1, 1], ids
    assert len({found[0] for found in ids}) == 3
    assert response.headers["x-accel-buffering"] == "no"


def test_a_hang_up_gives_the_place_back_without_a_ping(postgres_url: str) -> None:
    """An idle stream notices its client hang up while it waits (it listens for the
    disconnect), not only when a ping fails to go out: with an hour between pings and
    room for one stream, the next stream is let in once the first one hung up."""
    config = replace(base_config("unused"), events_ping_s=3600, events_max_streams=1)
    with migrated_database(postgres_url) as url, serve(replace(config, database_url=url)) as r:
        vault = new_vault_id()
        head = push_ok(client(r), vault, Sealer(vault).blobs(1))["cursor"]
        with stream(r, vault, 0) as first:
            feed = opened(first)  # kept referenced: a dropped iterator closes its response
            assert next_event(feed).json() == {"cursor": head}
            with stream(r, vault, 0) as refused:  # the one place is taken
                refused.read()
                assert_error(refused, 503, "busy")

        def let_in() -> bool:
            with stream(r, vault, 0) as again:
                if again.status_code == 503:
                    again.read()
                    return False
                assert next_event(opened(again)).json() == {"cursor": head}
                return True

        wait_for(let_in, "the hung-up stream's place to be given back", every=0.1)


def test_a_graceful_stop_ends_open_streams_at_once(postgres_url: str) -> None:
    """A relay stopping (SIGTERM: uvicorn's graceful shutdown) ends its open streams with
    the end of their body instead of waiting out its shutdown timeout and then cutting
    them off (relay.http.scope_keys `STOP_ON_SHUTDOWN`). Served with the relay's own uvicorn
    protocol, as `engram-relay serve` serves it; pings an hour apart, so the only way
    the stream ends is the stop."""
    config = replace(base_config("unused"), events_ping_s=3600)
    with migrated_database(postgres_url) as url:
        config = replace(config, database_url=url)
        port = free_port()
        server = uvicorn.Server(
            GuardedConfig(
                create_app(config),
                limits=ConnectionLimits(),
                host="127.0.0.1",
                port=port,
                log_level="warning",
                timeout_graceful_shutdown=20,  # cut off after 20 s: the client sees an error
            )
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            wait_for(lambda: server.started, "the relay to start")
            relay = Relay(f"http://127.0.0.1:{port}", url, config)
            vault = new_vault_id()
            with stream(relay, vault, 0) as first, stream(relay, vault, 0) as second:
                feeds = [opened(first), opened(second)]
                server.should_exit = True
                # Each stream ends cleanly (an incomplete chunked body would raise here).
                assert [list(feed) for feed in feeds] == [[], []]
            thread.join(timeout=60)
            assert not thread.is_alive()
        finally:
            server.should_exit = True
            thread.join(timeout=60)
