"""The change hub of one relay process (relay/services/change_hub.py, PROTOCOL §15) on its own: pure
asyncio, no database. And which vaults a group commit announces (relay/store/push.py)."""

from __future__ import annotations

import asyncio

import pytest

from engram_sync.relay.domain.domain_errors import QuotaExceededError
from engram_sync.relay.domain.push_rules import PushPlan, check_structure
from engram_sync.relay.services.change_hub import ChangeHub, HubFullError
from engram_sync.relay.services.config import config_from_env
from engram_sync.relay.store.push import PushJob, PushOutcome, committed_changes
from engram_sync.shared_format.wire import MAX_BLOBS_PER_PUSH
from tests.relay.support import Sealer

LONG = 60.0  # never reached when things work


def test_a_publish_wakes_the_vaults_waiters_only() -> None:
    async def go() -> None:
        hub = ChangeHub(max_waiters=10)
        with hub.watch("a") as a, hub.watch("b") as b:
            va, vb = a.version, b.version
            woke_a = asyncio.create_task(a.wait(va, LONG))
            woke_b = asyncio.create_task(b.wait(vb, 0.05))
            await asyncio.sleep(0)
            hub.publish("a", 7)
            assert await woke_a is True
            assert await woke_b is False  # b was not woken: its wait timed out
            assert (a.seq, b.seq) == (7, 0)

    asyncio.run(go())


def test_an_older_or_equal_sequence_wakes_nobody() -> None:
    async def go() -> None:
        hub = ChangeHub(max_waiters=10)
        with hub.watch("a") as a:
            hub.publish("a", 5)
            version = a.version
            hub.publish("a", 5)
            hub.publish("a", 3)
            assert a.version == version
            assert await a.wait(version, 0.01) is False
            assert a.seq == 5

    asyncio.run(go())


def test_a_wake_between_reading_the_version_and_waiting_is_not_lost() -> None:
    async def go() -> None:
        hub = ChangeHub(max_waiters=10)
        with hub.watch("a") as a:
            version = a.version
            hub.publish("a", 1)  # before the wait starts
            assert await a.wait(version, LONG) is True

    asyncio.run(go())


def test_recheck_all_moves_every_epoch_and_takes_the_heads() -> None:
    async def go() -> None:
        hub = ChangeHub(max_waiters=10)
        with hub.watch("a") as a, hub.watch("b") as b:
            hub.publish("a", 4)
            epochs = (a.epoch, b.epoch)
            hub.recheck_all({"a": 2, "b": 9})
            assert (a.epoch, b.epoch) == (epochs[0] + 1, epochs[1] + 1)
            assert (a.seq, b.seq) == (4, 9)  # a head read never lowers what was heard
            hub.recheck("a")
            assert (a.epoch, b.epoch) == (epochs[0] + 2, epochs[1] + 1)

    asyncio.run(go())


def test_the_cap_and_the_watch_lifetime() -> None:
    async def go() -> None:
        hub = ChangeHub(max_waiters=2)
        with hub.watch("a"), hub.watch("a") as second:
            with pytest.raises(HubFullError), hub.watch("b"):
                pass
            assert hub.watched() == ["a"]
            assert second.users == 2
        assert hub.waiters == 0
        assert hub.watched() == []  # no watch kept for a vault nobody waits on
        hub.publish("a", 1)  # dropped, nothing kept
        assert hub.watched() == []
        with hub.watch("b"):  # places are back
            assert hub.watched() == ["b"]

    asyncio.run(go())


def _outcome(cursor: int, accepted: int) -> PushOutcome:
    checked = check_structure(Sealer("a").blobs(accepted), MAX_BLOBS_PER_PUSH) if accepted else []
    return PushOutcome(plan=PushPlan(accepted=checked), cursor=cursor)


def test_a_group_commit_announces_each_vault_once_at_its_head() -> None:
    jobs = [PushJob(v, [], None) for v in ("a", "b", "a", "c", "d")]
    results = [
        _outcome(3, 2),
        _outcome(10, 1),
        _outcome(5, 2),  # the same vault later in the group: its head after the commit
        _outcome(8, 0),  # nothing accepted: nothing to announce
        QuotaExceededError("bytes", 1, 2),  # refused: nothing written
    ]
    heads = {c.vault_id: c.seq for c in committed_changes(jobs, results)}
    assert heads == {"a": 5, "b": 10}


def test_the_feed_settings_come_from_the_environment() -> None:
    config = config_from_env(
        "postgresql://x@h/db",
        {"ENGRAM_RELAY_EVENTS_PING_S": "0.5", "ENGRAM_RELAY_EVENTS_MAX_STREAMS": "7"},
    )
    assert (config.events_ping_s, config.events_max_streams) == (0.5, 7)
    defaults = config_from_env("postgresql://x@h/db", {})
    assert (defaults.events_ping_s, defaults.events_max_streams) == (15.0, 10_000)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ENGRAM_RELAY_EVENTS_PING_S", "0"),
        ("ENGRAM_RELAY_EVENTS_PING_S", "soon"),
        ("ENGRAM_RELAY_EVENTS_PING_S", "3601"),
        ("ENGRAM_RELAY_EVENTS_MAX_STREAMS", "0"),
        ("ENGRAM_RELAY_EVENTS_MAX_STREAMS", "1.5"),
    ],
)
def test_bad_feed_settings_are_refused_naming_them(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        config_from_env("postgresql://x@h/db", {name: value})
