"""Hostile vault ids on every channel of the live feed (issue 31, finding 3;
docs/live-feed.md "Channels and payloads").

A vault id may hold spaces, brackets, quotes, braces (relay.ids refuses only control
characters), and the ids travel in the NOTIFY payloads between relay processes. Pushes
to vaults named after a victim vault, over real HTTP on two real relay processes and
PostgreSQL, must leave the victim's streams on both processes alone: no change event of
theirs, the victim's next commit still heard, and its `blobs=1` event carrying only its
own blobs, exactly as a pull gives them. The hostile-named vaults' own streams work (the
honest case). The payload's reader alone: an older relay's payload or a forged blob is
refused, never read as another vault's commit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Any
from urllib.parse import quote

import httpx
import msgspec
import pytest
from msgspec.structs import replace as struct_replace

from engram_sync.relay.services.change_hub import ChangeHub
from engram_sync.relay.services.feed_listener import FeedListener
from engram_sync.relay.store.feed_notify import (
    MAX_NOTIFY_PAYLOAD,
    Commit,
    commit_payload,
    encode_blobs,
    parse_commit,
)
from engram_sync.shared_format.wire import SyncBlob
from tests.relay.conftest import ADMIN_KEY, Relay, base_config
from tests.relay.sse import Message, messages, next_event
from tests.relay.support import Sealer, client, migrated_database, new_vault_id, serve, wire


def _path(vault: str, route: str) -> str:
    return f"/v1/vaults/{quote(vault, safe='')}/{route}"


def _push(http: httpx.Client, vault: str, blobs: list[SyncBlob]) -> int:
    answer = http.post(_path(vault, "push"), json={"blobs": [wire(b) for b in blobs]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["rejected"] == []
    cursor: int = answer.json()["cursor"]
    return cursor


def _pull(http: httpx.Client, vault: str, cursor: int) -> dict[str, Any]:
    answer = http.get(_path(vault, "pull"), params={"cursor": cursor})
    assert answer.status_code == 200, answer.text
    page: dict[str, Any] = answer.json()
    return page


@contextmanager
def _stream(relay: Relay, vault: str, cursor: int, *, blobs: bool) -> Iterator[Iterator[Message]]:
    params: dict[str, Any] = {"cursor": cursor, **({"blobs": 1} if blobs else {})}
    with (
        client(relay, ADMIN_KEY) as http,
        http.stream("GET", _path(vault, "events"), params=params) as response,
    ):
        assert response.status_code == 200, response.read()
        feed = messages(response)
        assert next(feed) == Message(retry=2000)
        yield feed


def _change(feed: Iterator[Message]) -> dict[str, Any]:
    message = next_event(feed)
    assert message.event == "change", message
    data: dict[str, Any] = message.json()
    return data


def _hostile_ids(victim: str, head: int) -> list[str]:
    """Vault ids that read, split on spaces or spliced into JSON, as the victim's."""
    return [
        f"{victim} {head} {head + 1} [",  # a forged commit head -> head+1 with its bytes
        f"{victim} 2 1000000000000000 [",  # a sequence no real commit passes: silence
        f'{victim}","after":{head},"seq":{head + 1},"blobs":[]}}',  # JSON injection
        f"{victim} {head + 5}",  # the `<vault_id> <seq>` change payload, read from the left
        f"[\"{victim}\"] {{}} 'q' \\ ",  # brackets, braces, quotes, a backslash
    ]


def test_pushes_to_hostile_named_vaults_leave_the_victims_streams_alone(postgres_url: str) -> None:
    with migrated_database(postgres_url) as url:
        config = replace(base_config(url), events_ping_s=0.2)
        with (
            serve(config) as one,
            serve(config) as other,
            client(one, ADMIN_KEY) as http,
            ExitStack() as streams,
        ):
            victim = new_vault_id()
            sealer = Sealer(victim)
            head = _push(http, victim, sealer.blobs(1))
            carried = [
                streams.enter_context(_stream(r, victim, head, blobs=True)) for r in (one, other)
            ]
            plain = [
                streams.enter_context(_stream(r, victim, head, blobs=False)) for r in (one, other)
            ]
            hostile = _hostile_ids(victim, head)
            # the honest case beside it: a hostile-named vault's own stream hears its commit
            first = Sealer(hostile[0])
            _push(http, hostile[0], first.blobs(1))
            own = streams.enter_context(_stream(other, hostile[0], 1, blobs=True))
            for vault in hostile:
                _push(http, vault, [Sealer(vault).blob("hostile", 1)])
            # the victim's streams heard nothing of them: their next change is the
            # victim's own next commit, with its own blobs only
            pushed = _push(http, victim, [sealer.blob("mine", 1)])
            page = _pull(http, victim, head)
            for feed in carried:
                event = _change(feed)
                assert (event["after"], event["cursor"]) == (head, pushed)
                assert event["blobs"] == page["blobs"]
                assert [b["vault_id"] for b in event["blobs"]] == [victim]
            for feed in plain:
                assert _change(feed) == {"cursor": pushed}
            # and they stay live
            again = _push(http, victim, [sealer.blob("again", 1)])
            for feed in (*carried, *plain):
                assert _change(feed)["cursor"] == again
            own_event = _change(own)
            assert (own_event["after"], own_event["cursor"]) == (1, 2)
            assert [b["vault_id"] for b in own_event["blobs"]] == [hostile[0]]


# -- the payload's reader alone -------------------------------------------------------


def _blob(vault: str, seq: int, memory_id: str = "m") -> SyncBlob:
    return struct_replace(Sealer(vault).blob(memory_id, 1), seq=seq)


def _carried(vault: str, after: int, blobs: list[SyncBlob]) -> Commit:
    return Commit(vault, after, after + len(blobs), msgspec.json.encode(blobs))


@pytest.mark.parametrize("vault", ["plain", "a b 1 2 [", '"}],"x', "[]", "é 漢 🙂"])
def test_the_commit_payload_round_trips_any_vault_id(vault: str) -> None:
    commit = _carried(vault, 4, [_blob(vault, 5), _blob(vault, 6, "n")])
    payload = commit_payload(commit)
    assert payload is not None
    assert payload.endswith("}")  # an older relay's reader wants a trailing "]": refused
    assert parse_commit(payload) == commit


def test_a_long_quoted_vault_id_still_fits_notify_or_the_commit_carries_nothing() -> None:
    # JSON escapes each quote: a 256-character id of quotes takes 512 bytes per mention;
    # small blobs still travel, 8 blobs of 700 ciphertext characters (a commit small enough
    # to carry, INLINE_MAX_*) no longer fit 7,900 bytes and the devices pull (as before)
    vault = '"' * 256
    small = _carried(vault, 0, [_blob(vault, n, f"m{n}") for n in range(1, 9)])
    payload = commit_payload(small)
    assert payload is not None
    assert len(payload.encode()) <= MAX_NOTIFY_PAYLOAD
    assert parse_commit(payload) == small
    sealer = Sealer(vault)
    sized = [struct_replace(sealer.sized(f"m{n}", 1, 700), seq=n) for n in range(1, 9)]
    assert encode_blobs(sized) is not None
    assert commit_payload(_carried(vault, 0, sized)) is None


def test_the_payload_reader_refuses_what_is_not_one_commit_of_one_vault() -> None:
    victim = "victim"
    own = _blob(victim, 5)
    foreign = _blob("elsewhere", 5)

    def note(**fields: Any) -> str:
        base: dict[str, Any] = {"vault_id": victim, "after": 4, "seq": 5, "blobs": [own]}
        return msgspec.json.encode({**base, **fields}).decode()

    assert parse_commit(note()) == _carried(victim, 4, [own])
    refused = [
        f"{victim} 2 1000000000000000 [ 0 1 []",  # an older relay's payload
        "victim 4 5 []",
        "",
        "{",
        note(blobs=[foreign]),  # another vault's blob
        note(blobs=[struct_replace(own, seq=msgspec.UNSET)]),  # no seq
        note(blobs=[struct_replace(own, seq=9)]),  # past the commit
        note(blobs=[own, own]),  # not ascending
        note(blobs=[]),
        note(after=5),  # nothing committed
        note(after=-1),
        note(vault_id=""),
        note(blobs=[{"vault_id": victim, "seq": 5}]),  # not a SyncBlob
        note(blobs="[]"),
    ]
    for payload in refused:
        assert parse_commit(payload) is None, payload


def test_a_payload_not_ours_is_ignored_and_the_change_still_wakes() -> None:
    hub = ChangeHub(max_waiters=4)
    listener = FeedListener("postgresql://unused@localhost/db", hub)
    with hub.watch("victim") as watch:
        listener._on_commit(None, 0, "engram_vault_commits", "victim 2 1000000000000000 [ 0 1 []")
        assert (watch.seq, listener.ignored_commits) == (0, 1)
        listener._on_change(None, 0, "engram_vault_changes", "victim 3")
        assert watch.seq == 3


def test_the_change_and_revocation_payloads_of_hostile_ids_reach_only_their_vault() -> None:
    # `<vault_id> <seq>` is read from the right, `<vault_id>` whole: a vault named after
    # the victim moves or re-checks its own watch, never the victim's
    hub = ChangeHub(max_waiters=4)
    listener = FeedListener("postgresql://unused@localhost/db", hub)
    hostile = "victim 99"
    with hub.watch("victim") as victim, hub.watch(hostile) as other:
        listener._on_change(None, 0, "engram_vault_changes", f"{hostile} 5")
        assert (victim.seq, other.seq) == (0, 5)
        listener._on_revocation(None, 0, "engram_vault_revocations", hostile)
        listener._on_revocation(None, 0, "engram_vault_revocations", "victim ")
        assert (victim.epoch, other.epoch) == (0, 1)
