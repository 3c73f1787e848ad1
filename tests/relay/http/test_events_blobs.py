"""Small commits' blobs in the change event (`events?blobs=1`, feature `events-blobs`;
docs/live-feed.md "Blobs in the event"), over real HTTP on real relays and PostgreSQL:
the blobs are exactly what a cursor pull from `after` gives; a stream without `blobs=1`,
a large commit, and a stream whose cursor the relay kept no commits for get the plain
hint; a second relay process on the same database hands the blobs on through NOTIFY.
The pieces alone: the hub's commit memory, the NOTIFY payload, a group's commits."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import httpx
import msgspec
import pytest

from engram_sync.relay.domain.domain_errors import QuotaExceededError
from engram_sync.relay.domain.push_rules import PushPlan, check_structure
from engram_sync.relay.http.routes.events import change_message
from engram_sync.relay.services.change_hub import KEPT_COMMITS, ChangeHub
from engram_sync.relay.store.feed_notify import (
    INLINE_MAX_BLOBS,
    MAX_NOTIFY_PAYLOAD,
    Commit,
    commit_payload,
)
from engram_sync.relay.store.push import PushJob, PushOutcome, committed_changes
from engram_sync.shared_format.wire import MAX_BLOBS_PER_PUSH, ChangeEvent, SyncBlob
from tests.relay.conftest import ADMIN_KEY, Relay, base_config
from tests.relay.sse import Message, messages, next_event
from tests.relay.support import (
    Sealer,
    client,
    migrated_database,
    module_relay_fixture,
    new_vault_id,
    pull_ok,
    push_ok,
    serve,
)

relay = module_relay_fixture(events_ping_s=0.2)


@contextmanager
def stream(relay: Relay, vault: str, cursor: int, *, blobs: bool) -> Iterator[Iterator[Message]]:
    params: dict[str, Any] = {"cursor": cursor}
    if blobs:
        params["blobs"] = 1
    with (
        client(relay, ADMIN_KEY) as http,
        http.stream("GET", f"/v1/vaults/{vault}/events", params=params) as response,
    ):
        assert response.status_code == 200, response.read()
        feed = messages(response)
        assert next(feed) == Message(retry=2000)
        yield feed


def change(feed: Iterator[Message]) -> dict[str, Any]:
    message = next_event(feed)
    assert message.event == "change", message
    data: dict[str, Any] = message.json()
    return data


def test_a_blobs_stream_gets_the_commit_as_a_pull_from_after_gives_it(
    relay: Relay, http: httpx.Client
) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    head = push_ok(http, vault, sealer.blobs(3))["cursor"]
    with (
        stream(relay, vault, head, blobs=True) as carried,
        stream(relay, vault, head, blobs=False) as plain,
    ):
        pushed = push_ok(http, vault, [sealer.blob("new", 1), sealer.blob("mem-0001", 2)])
        event = change(carried)
        hint = change(plain)
    page = pull_ok(http, vault, cursor=head)
    assert event["cursor"] == pushed["cursor"] == head + 2
    assert event["after"] == head
    assert event["generation"] == page["generation"]
    assert event["blobs"] == page["blobs"]  # every field, `seq` included
    assert [b["memory_id"] for b in event["blobs"]] == ["new", "mem-0001"]
    # The wire type decodes it (what the client reads), and a stream without blobs=1 gets
    # the plain hint of PROTOCOL §15 for the same commit.
    decoded = ChangeEvent.__struct_fields__
    assert set(event) == set(decoded)
    assert hint == {"cursor": head + 2}


def test_a_large_commit_and_a_cursor_the_relay_kept_nothing_for_get_the_plain_hint(
    relay: Relay, http: httpx.Client
) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    head = push_ok(http, vault, sealer.blobs(2))["cursor"]
    with stream(relay, vault, 0, blobs=True) as feed:
        # behind at the start: the commits before the stream were not kept
        assert change(feed) == {"cursor": head}
        big = push_ok(http, vault, sealer.blobs(INLINE_MAX_BLOBS + 1, prefix="big"))["cursor"]
        assert change(feed) == {"cursor": big}
        small = push_ok(http, vault, [sealer.blob("small", 1)])["cursor"]
        event = change(feed)
    assert (event["after"], event["cursor"]) == (big, small)
    assert [b["memory_id"] for b in event["blobs"]] == ["small"]


def test_another_process_hands_the_blobs_on_through_notify(postgres_url: str) -> None:
    with migrated_database(postgres_url) as url:
        config = replace(base_config(url), events_ping_s=0.2)
        with serve(config) as one, serve(config) as other, client(one, ADMIN_KEY) as http:
            vault = new_vault_id()
            sealer = Sealer(vault)
            head = push_ok(http, vault, sealer.blobs(1))["cursor"]
            with stream(other, vault, head, blobs=True) as feed:
                pushed = push_ok(http, vault, [sealer.blob("through-one", 1)])["cursor"]
                event = change(feed)
            page = pull_ok(http, vault, cursor=head)
    assert (event["after"], event["cursor"]) == (head, pushed)
    assert event["blobs"] == page["blobs"]
    assert len(page["blobs"]) == 1


# -- the pieces alone -------------------------------------------------------------------


def _commit(after: int, seq: int, blobs: bytes | None = b'[{"m":1}]', vault: str = "v") -> Commit:
    return Commit(vault, after, seq, blobs)


def test_a_watch_keeps_commits_only_for_blobs_streams_and_chains_them() -> None:
    hub = ChangeHub(max_waiters=10)
    with hub.watch("v") as watch:
        hub.publish_commits([_commit(0, 1)])
        assert watch.seq == 1
        assert watch.blobs_between(0, 1) is None  # no `blobs=1` stream: nothing kept
        watch.carriers += 1
        hub.publish_commits([_commit(1, 3, b'[{"a":1},{"b":2}]'), _commit(3, 4, b'[{"c":3}]')])
        assert watch.blobs_between(1, 3) == b'[{"a":1},{"b":2}]'
        assert watch.blobs_between(1, 4) == b'[{"a":1},{"b":2},{"c":3}]'  # two chained
        assert watch.blobs_between(0, 4) is None  # a gap: the commit before was not kept
        assert watch.blobs_between(1, 5) is None  # past what was kept
        assert watch.blobs_between(3, 3) is None  # nothing asked
        hub.publish_commits([_commit(4, 9, None)])  # too large to carry its blobs
        assert watch.blobs_between(4, 9) is None
        assert watch.seq == 9
        for n in range(10, 10 + KEPT_COMMITS + 1):
            hub.publish_commits([_commit(n - 1, n)])
        assert watch.blobs_between(9, 10) is None  # the oldest dropped: the memory is bounded
        assert watch.blobs_between(10, 10 + KEPT_COMMITS) is not None


def test_a_commit_without_blobs_or_too_large_for_notify_has_no_payload() -> None:
    # the payload itself, with hostile vault ids: tests/relay/http/test_feed_hostile_ids.py
    assert commit_payload(_commit(4, 6, None)) is None
    assert commit_payload(_commit(4, 6, b"[" + b"1," * MAX_NOTIFY_PAYLOAD + b"1]")) is None
    fits = commit_payload(_commit(4, 6, b"[" + b"1," * (MAX_NOTIFY_PAYLOAD // 3) + b"1]"))
    assert fits is not None
    assert len(fits.encode()) <= MAX_NOTIFY_PAYLOAD


def _outcome(cursor: int, blobs: list[SyncBlob]) -> PushOutcome:
    checked = check_structure(blobs, MAX_BLOBS_PER_PUSH) if blobs else []
    return PushOutcome(plan=PushPlan(accepted=checked), cursor=cursor)


def test_a_group_commit_carries_what_it_wrote_to_each_vault() -> None:
    a, b = Sealer("a"), Sealer("b")
    jobs = [PushJob(v, [], None) for v in ("a", "b", "a", "c", "a")]
    results = [
        _outcome(3, [a.blob("m1", 1), a.blob("m2", 1)]),  # seq 2, 3
        _outcome(10, b.blobs(INLINE_MAX_BLOBS + 1)),  # too many to carry
        _outcome(5, [a.blob("m1", 2), a.blob("m3", 1)]),  # seq 4 replaces m1's 2, then 5
        QuotaExceededError("bytes", 1, 2),  # refused: nothing written
        _outcome(5, []),  # nothing accepted
    ]
    commits = {c.vault_id: c for c in committed_changes(jobs, results)}
    assert set(commits) == {"a", "b"}
    assert (commits["a"].after, commits["a"].seq) == (1, 5)
    assert (commits["b"].after, commits["b"].seq, commits["b"].blobs) == (1, 10, None)
    carried = commits["a"].blobs
    assert carried is not None
    written = msgspec.json.decode(carried, type=list[SyncBlob])
    assert [(x.memory_id, x.vector_clock, x.seq) for x in written] == [
        ("m2", 1, 3),
        ("m1", 2, 4),
        ("m3", 1, 5),
    ]
    assert {x.vault_id for x in written} == {"a"}


@pytest.mark.parametrize("blobs", [0, 1])
def test_blobs_takes_only_0_or_1(relay: Relay, http: httpx.Client, blobs: int) -> None:
    vault = new_vault_id()
    bad = http.get(f"/v1/vaults/{vault}/events", params={"cursor": 0, "blobs": 2})
    assert bad.status_code == 400
    assert "blobs" in bad.text
    with stream(relay, vault, 0, blobs=bool(blobs)) as feed:
        assert next(feed) == Message(comment="ping")  # accepted: the stream runs


def test_the_change_message_carries_the_blobs_as_json_and_leaves_out_an_unknown_generation() -> (
    None
):
    carried = change_message(7, after=5, blobs=b'[{"m":1}]', generation="g1")
    assert (
        carried
        == b'event: change\ndata: {"cursor":7,"after":5,"generation":"g1","blobs":[{"m":1}]}\n\n'
    )
    unknown = change_message(7, after=5, blobs=b"[]", generation=msgspec.UNSET)
    assert unknown == b'event: change\ndata: {"cursor":7,"after":5,"blobs":[]}\n\n'
    assert change_message(7) == b'event: change\ndata: {"cursor":7}\n\n'  # the plain hint
