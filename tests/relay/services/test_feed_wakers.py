"""The wakers an idle event stream registers on its vault's watch (relay/services/change_hub.py,
PROTOCOL §15): called on every wake of that vault, and only while registered. Pure
asyncio, no database; the stream itself is tested over HTTP in test_events.py."""

from __future__ import annotations

import asyncio

from engram_sync.relay.services.change_hub import ChangeHub


def test_a_waker_is_called_on_each_wake_of_its_vault_only() -> None:
    async def go() -> None:
        hub = ChangeHub(max_waiters=10)
        calls: list[str] = []
        with hub.watch("a") as a, hub.watch("b") as b:
            a.add_waker(lambda: calls.append("a"))
            b.add_waker(lambda: calls.append("b"))
            hub.publish("a", 3)
            assert calls == ["a"]
            hub.publish("a", 3)  # nothing new: no wake
            hub.publish("a", 2)
            assert calls == ["a"]
            hub.recheck("b")  # a revocation notice wakes too
            assert calls == ["a", "b"]
            hub.recheck_all({})
            assert sorted(calls) == ["a", "a", "b", "b"]

    asyncio.run(go())


def test_a_discarded_waker_is_not_called() -> None:
    async def go() -> None:
        hub = ChangeHub(max_waiters=10)
        calls: list[int] = []

        def waker() -> None:
            calls.append(1)

        with hub.watch("a") as a:
            a.add_waker(waker)
            hub.publish("a", 1)
            assert calls == [1]  # the positive case
            a.discard_waker(waker)
            a.discard_waker(waker)  # twice is fine
            hub.publish("a", 2)
            assert calls == [1]

    asyncio.run(go())


def test_a_waker_may_discard_itself_while_called() -> None:
    async def go() -> None:
        hub = ChangeHub(max_waiters=10)
        calls: list[str] = []
        with hub.watch("a") as a:

            def once() -> None:
                calls.append("once")
                a.discard_waker(once)

            a.add_waker(once)
            a.add_waker(lambda: calls.append("always"))
            hub.publish("a", 1)
            hub.publish("a", 2)
            assert sorted(calls) == ["always", "always", "once"]

    asyncio.run(go())
