"""Who may hold how many event streams and long-polls (relay/domain/stream_holders.py, PROTOCOL
§15, issue 31 finding 2), on its own: the pure admission decision (holder counts -> admit,
evict whose oldest, or refuse), its executor, and the connection guard's choice of the
heaviest holder. No database, no HTTP: tests/relay/serving/test_stream_caps.py holds the same
promises through a real relay."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engram_sync.relay.domain.stream_holders import (
    ADMIT,
    Evict,
    Holder,
    Refuse,
    StreamCapError,
    StreamCaps,
    StreamHolders,
    admission,
    heaviest_holder,
)
from engram_sync.relay.services.config import RelayConfig, config_from_env

CAPS = StreamCaps(per_key=2, per_account=3, per_address=4)


@pytest.mark.parametrize(
    ("key", "account", "address", "decision"),
    [
        (0, 0, 0, ADMIT),
        (1, 2, 3, ADMIT),  # each one below its cap
        (1, None, 3, ADMIT),  # an operator key has no account
        (2, 0, 2, Evict("key")),  # the key at its cap: its own oldest goes
        (1, 3, 3, Evict("account")),  # the account at its cap: its own oldest goes
        (2, 3, 3, Evict("key")),  # both: the key first (then decided again)
        (2, None, 3, Evict("key")),
        (0, 0, 4, Refuse("address", 4)),  # an address is shared: refused, nobody evicted
        (2, 3, 4, Refuse("address", 4)),  # the address first: a refusal ends nothing
        (0, None, 9, Refuse("address", 4)),
    ],
)
def test_admission(key: int, account: int | None, address: int, decision: object) -> None:
    assert admission(key, account, address, CAPS) == decision


def test_defaults_sit_well_below_the_connection_cap() -> None:
    caps = StreamCaps()
    assert (caps.per_key, caps.per_account, caps.per_address) == (8, 32, 64)
    assert caps.per_address * 10 < 1000  # ENGRAM_RELAY_MAX_CONNECTIONS' default


class Ended:
    """The waiters `evict` was called for, in order."""

    def __init__(self) -> None:
        self.order: list[str] = []

    def of(self, name: str) -> Callable[[], None]:
        def end() -> None:
            self.order.append(name)

        return end


def test_a_key_over_its_cap_ends_its_own_oldest_and_nobody_elses() -> None:
    holders, ended = StreamHolders(CAPS), Ended()
    mine = Holder("k1", None, "10.0.0.1")
    other = Holder("k2", None, "10.0.0.1")
    holders.enter(other, ended.of("other"))
    holders.enter(mine, ended.of("first"))
    holders.enter(mine, ended.of("second"))
    assert ended.order == []
    holders.enter(mine, ended.of("third"))
    assert ended.order == ["first"]  # the oldest of the key, not the other key's older one
    holders.enter(mine, ended.of("fourth"))
    assert ended.order == ["first", "second"]
    assert holders.count("key:k1") == 2
    assert holders.count("key:k2") == 1
    assert holders.count("address:10.0.0.1") == 3
    assert holders.evicted == 2


def test_an_account_over_its_cap_ends_its_oldest_across_its_keys() -> None:
    holders, ended = StreamHolders(CAPS), Ended()
    for n, key in enumerate(("k1", "k2", "k3")):
        holders.enter(Holder(key, "acct", f"10.0.0.{n}"), ended.of(key))
    holders.enter(Holder("k4", "acct", "10.0.0.9"), ended.of("k4"))
    assert ended.order == ["k1"]
    assert holders.count("account:acct") == 3
    assert holders.count("address:10.0.0.0") == 0


def test_an_address_at_its_cap_is_refused_and_nothing_ends() -> None:
    holders, ended = StreamHolders(CAPS), Ended()
    places = [holders.enter(Holder(f"k{n}", None, "10.0.0.1"), ended.of(f"k{n}")) for n in range(4)]
    with pytest.raises(StreamCapError) as refused:
        holders.enter(Holder("k9", None, "10.0.0.1"), ended.of("k9"))
    assert (refused.value.dimension, refused.value.limit) == ("address", 4)
    assert refused.value.env == "ENGRAM_RELAY_EVENTS_MAX_PER_ADDRESS"
    assert ended.order == []
    holders.enter(Holder("k9", None, "10.0.0.2"), ended.of("k9"))
    holders.leave(places[0])  # a stream ended: the address has room again
    holders.leave(places[0])  # twice (an evicted one gives its place back too): no harm
    holders.enter(Holder("k9", None, "10.0.0.1"), ended.of("k9"))
    assert holders.count("address:10.0.0.1") == 4
    assert holders.refused == 1


def test_the_heaviest_holder_is_the_one_holding_most() -> None:
    assert heaviest_holder({}) is None
    held = {"key:a": [1], "address:x": [1, 2, 3], "account:b": [1, 2]}
    assert heaviest_holder(held) == "address:x"
    assert heaviest_holder({"key:a": [1, 2], "key:b": [3, 4]}) == "key:a"  # first of equals


def test_caps_come_from_the_environment_and_must_be_positive() -> None:
    config = config_from_env(
        "postgresql://x/y",
        env={
            "ENGRAM_RELAY_EVENTS_MAX_PER_KEY": "3",
            "ENGRAM_RELAY_EVENTS_MAX_PER_ACCOUNT": "5",
            "ENGRAM_RELAY_EVENTS_MAX_PER_ADDRESS": "7",
        },
    )
    assert config.stream_caps == StreamCaps(3, 5, 7)
    assert RelayConfig("postgresql://x/y").stream_caps == StreamCaps()
    for name in ("KEY", "ACCOUNT", "ADDRESS"):
        variable = f"ENGRAM_RELAY_EVENTS_MAX_PER_{name}"
        with pytest.raises(ValueError, match=variable):
            config_from_env("postgresql://x/y", env={variable: "0"})
        with pytest.raises(ValueError, match=variable):
            config_from_env("postgresql://x/y", env={variable: "many"})
