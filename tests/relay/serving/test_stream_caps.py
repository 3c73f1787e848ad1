"""One holder's event streams cannot take every connection (issue 31 finding 2; PROTOCOL
§15, relay/domain/stream_holders.py, relay/serving/connections.py), over real HTTP on a real
relay and PostgreSQL:

- a key past its cap ends its own oldest stream (or held pull) to admit its newest, while
  another key's stream, push and pull go on;
- a client address (as relay.domain.client_address counts it: X-Forwarded-For believed only
  from a trusted proxy, its left part never) past its cap is refused 429 JSON naming the
  cap, and nobody's stream ends; another address's stream is let in;
- with the connection cap small and one key holding every connection with streams
  (per-holder caps set out of reach), another device's push on a new connection is
  answered: the guard closes the heaviest holder's oldest stream (`engram-relay serve`
  in a process of its own, as deployed).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.relay.conftest import ADMIN_KEY, base_config
from tests.relay.sse import Message, messages, next_event
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    migrated_database,
    new_vault_id,
    pull_ok,
    push_ok,
    serve,
    wait_for,
)
from tests.reliability.support import RelayProcess

PING_S = 0.2
EVICTED = "evicted: a newer stream of this key or account took its place"
BIN = Path(sys.executable).parent


@contextmanager
def stream(
    url: str, vault: str, key: str, headers: dict[str, str] | None = None
) -> Iterator[httpx.Response]:
    with (
        httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {key}"} | (headers or {}), timeout=30
        ) as http,
        http.stream("GET", f"/v1/vaults/{vault}/events", params={"cursor": 0}) as response,
    ):
        yield response


def opened(response: httpx.Response) -> Iterator[Message]:
    assert response.status_code == 200, response.read()
    feed = messages(response)
    assert next(feed) == Message(retry=2000)
    return feed


def ended(feed: Iterator[Message]) -> list[Message]:
    """What a stream still sends until its end (AssertionError if it goes on pinging)."""
    rest: list[Message] = []
    deadline = time.monotonic() + 30
    try:
        for message in feed:
            rest.append(message)
            assert time.monotonic() < deadline, f"the stream did not end: {rest[-5:]}"
    except httpx.HTTPError:  # closed under it (the connection guard)
        rest.append(Message(comment="closed"))
    return rest


def test_a_key_past_its_cap_ends_its_own_oldest_stream_not_anyone_elses(
    postgres_url: str,
) -> None:
    config = replace(base_config("unused"), events_ping_s=PING_S, events_max_per_key=2)
    with migrated_database(postgres_url) as url, serve(replace(config, database_url=url)) as r:
        vault = new_vault_id()
        hog, other = r.mint(vault), r.mint(vault)
        with ExitStack() as held:
            mine = [opened(held.enter_context(stream(r.url, vault, hog))) for _ in range(2)]
            theirs = opened(held.enter_context(stream(r.url, vault, other)))
            newest = opened(held.enter_context(stream(r.url, vault, hog)))  # the key's third
            assert ended(mine[0])[-1] == Message(comment=EVICTED)  # its oldest, at once
            for feed in (mine[1], newest, theirs):  # the rest go on
                assert next(feed) == Message(comment="ping")
            # The other key pushes and pulls, and its stream hears of the push.
            with client(r, other) as http:
                head = push_ok(http, vault, Sealer(vault).blobs(1))["cursor"]
                assert pull_ok(http, vault, cursor=0)["cursor"] == head
            assert next_event(theirs).json() == {"cursor": head}
            # A held pull of the key counts too: it ends the key's oldest stream now.
            answer: dict[str, Any] = {}

            def held_pull() -> None:
                with client(r, hog) as http:
                    answer.update(pull_ok(http, vault, cursor=head, wait=60))

            waiter = threading.Thread(target=held_pull)
            waiter.start()
            assert ended(mine[1])[-1] == Message(comment=EVICTED)
            # Two newer streams of the key: the first ends `newest`, the second the held
            # pull, which answers at once (not after its 60 s).
            last = [opened(held.enter_context(stream(r.url, vault, hog)))]
            assert ended(newest)[-1] == Message(comment=EVICTED)
            last.append(opened(held.enter_context(stream(r.url, vault, hog))))
            waiter.join(timeout=20)  # below its client's 30 s read timeout
            assert not waiter.is_alive(), "the evicted held pull was not answered"
            assert answer["blobs"] == []
            assert answer["cursor"] == head
            for feed in (*last, theirs):  # still there
                assert next(feed).comment in {"ping", None}


def test_an_address_past_its_cap_is_refused_429_naming_the_cap(postgres_url: str) -> None:
    config = replace(
        base_config("unused"),
        events_ping_s=PING_S,
        events_max_per_address=2,
        trusted_proxies=(ip_network("127.0.0.1/32"),),  # the test is the proxy hop
    )
    with migrated_database(postgres_url) as url, serve(replace(config, database_url=url)) as r:
        vault = new_vault_id()
        keys = [r.mint(vault) for _ in range(4)]
        at = {"X-Forwarded-For": "203.0.113.5"}
        with ExitStack() as held:
            feeds = [opened(held.enter_context(stream(r.url, vault, k, at))) for k in keys[:2]]
            # A third key at the same address, even claiming another address on the left
            # of the header (only the right-most untrusted hop is believed): refused.
            spoofed = {"X-Forwarded-For": "198.51.100.1, 203.0.113.5"}
            for headers in (at, spoofed):
                with stream(r.url, vault, keys[2], headers) as refused:
                    assert refused.status_code == 429  # not a stream (its read never ends)
                    refused.read()
                    body = assert_error(refused, 429, "too_many_streams")
                    assert body["cap"] == "ENGRAM_RELAY_EVENTS_MAX_PER_ADDRESS"
                    assert body["limit"] == 2
                    assert "ENGRAM_RELAY_EVENTS_MAX_PER_ADDRESS" in body["error"]
                    assert refused.headers["retry-after"] == "30"
            with client(r, keys[2]) as http:  # a long-poll takes a place too
                http.headers.update(at)
                assert_error(http.get(f"/v1/vaults/{vault}/pull", params={"cursor": 0, "wait": 1}),
                             429, "too_many_streams")  # fmt: skip
                # ordinary requests of the address are not streams: answered
                head = push_ok(http, vault, Sealer(vault).blobs(1))["cursor"]
                assert pull_ok(http, vault, cursor=0)["cursor"] == head
            elsewhere = {"X-Forwarded-For": "203.0.113.6"}
            feeds.append(opened(held.enter_context(stream(r.url, vault, keys[3], elsewhere))))
            for feed in feeds:  # nobody's stream ended for the refusals
                assert next_event(feed).json() == {"cursor": head}

        def room_again() -> bool:  # the closed streams gave their places back
            with stream(r.url, vault, keys[2], at) as again:
                if again.status_code == 429:
                    again.read()
                    return False
                assert next_event(opened(again)).json() == {"cursor": head}
                return True

        wait_for(room_again, "the address's places to be given back", every=0.1)


CAP = 12


@pytest.fixture
def capped_relay(postgres_url: str, tmp_path: Path) -> Iterator[str]:
    """`engram-relay serve` with ENGRAM_RELAY_MAX_CONNECTIONS=12 and per-holder caps out of
    reach (so one key can hold every connection), in a process of its own."""
    env = {
        "SYNC_API_KEYS": f"{ADMIN_KEY}:100000,{HOG_KEY}:100000",
        "ENGRAM_RELAY_MAX_CONNECTIONS": str(CAP),
        "ENGRAM_RELAY_EVENTS_PING_S": str(PING_S),
        "ENGRAM_RELAY_EVENTS_MAX_PER_KEY": "1000",
        "ENGRAM_RELAY_EVENTS_MAX_PER_ADDRESS": "1000",
    }
    with migrated_database(postgres_url) as url:
        relay = RelayProcess(url, env=env, log_path=tmp_path / "relay.log")
        relay.start()
        try:
            yield relay.url
        finally:
            relay.stop()


HOG_KEY = "test-stream-hog-key-0123456789abcdef"


def test_a_full_process_closes_the_heaviest_holders_oldest_stream_for_a_push(
    capped_relay: str,
) -> None:
    vault, theirs = new_vault_id(), new_vault_id()
    with ExitStack() as held:
        feeds = [opened(held.enter_context(stream(capped_relay, vault, HOG_KEY)))]
        for _ in range(CAP - 1):  # every connection of the process: the hog's streams
            feeds.append(opened(held.enter_context(stream(capped_relay, vault, HOG_KEY))))
        for feed in feeds:
            assert next(feed) == Message(comment="ping")  # each one is live
        # Another device, on a new connection: answered, not 503 `overloaded`.
        with httpx.Client(
            base_url=capped_relay, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30
        ) as device:
            assert push_ok(device, theirs, Sealer(theirs).blobs(1))["cursor"] >= 1
        assert ended(feeds[0])[-1] == Message(comment="closed")  # the hog's oldest
        for feed in feeds[1:]:
            assert next(feed) == Message(comment="ping")  # the others go on
