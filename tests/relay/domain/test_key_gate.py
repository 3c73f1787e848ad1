"""Unit tests of relay/domain/key_gate.py with an injected clock (issue 36): refusals
decided before a key's database lookup, by the key's recent refusals and by address."""

from __future__ import annotations

import pytest

from engram_sync.relay.domain.key_gate import (
    FAILED_LOOKUPS_PER_S,
    KNOWN_FOR_S,
    UNKNOWN_FOR_S,
    KeyGate,
    Refusal,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_an_unknown_key_is_refused_without_a_lookup_for_a_while(clock: FakeClock) -> None:
    gate = KeyGate(clock)
    assert gate.before_lookup(b"k", "1.2.3.4", clock.now) is None  # the first time: look it up
    gate.not_found(b"k", "1.2.3.4")
    assert gate.before_lookup(b"k", "5.6.7.8", clock.now) == Refusal("unknown", UNKNOWN_FOR_S)
    clock.now += UNKNOWN_FOR_S
    assert (
        gate.before_lookup(b"k", "5.6.7.8", clock.now) is None
    )  # minted meanwhile? looked up again


def test_a_rate_limited_key_waits_out_its_bucket_without_a_lookup(clock: FakeClock) -> None:
    gate = KeyGate(clock)
    gate.found(b"k")
    gate.rate_limited(b"k", clock.now + 0.25)
    assert gate.before_lookup(b"k", "1.2.3.4", clock.now) == Refusal("rate_limited", 0.25)
    clock.now += 0.25
    assert gate.before_lookup(b"k", "1.2.3.4", clock.now) is None


def test_an_address_past_its_failed_lookups_is_refused_but_known_keys_pass(
    clock: FakeClock,
) -> None:
    gate = KeyGate(clock)
    gate.found(b"honest")
    for n in range(FAILED_LOOKUPS_PER_S):  # the burst: each looked up, each unknown
        assert gate.before_lookup(f"bad{n}".encode(), "1.2.3.4", clock.now) is None
        gate.not_found(f"bad{n}".encode(), "1.2.3.4")
    gate.not_found(b"one-more", "1.2.3.4")  # the bucket is empty now
    refusal = gate.before_lookup(b"never-seen", "1.2.3.4", clock.now)
    assert refusal is not None
    assert refusal.kind == "rate_limited"
    assert (
        gate.before_lookup(b"never-seen", "9.9.9.9", clock.now) is None
    )  # another address: looked up
    assert gate.before_lookup(b"honest", "1.2.3.4", clock.now) is None  # a key known good passes
    clock.now += refusal.wait
    assert gate.before_lookup(b"never-seen", "1.2.3.4", clock.now) is None
    clock.now += KNOWN_FOR_S
    for n in range(FAILED_LOOKUPS_PER_S + 1):
        gate.not_found(f"again{n}".encode(), "1.2.3.4")
    assert gate.before_lookup(b"honest", "1.2.3.4", clock.now) is not None  # known only for a while


def test_a_revoked_key_found_good_before_loses_its_pass(clock: FakeClock) -> None:
    gate = KeyGate(clock)
    gate.found(b"k")
    gate.not_found(b"k", "1.2.3.4")  # revoked since
    assert gate.before_lookup(b"k", "1.2.3.4", clock.now) == Refusal("unknown", UNKNOWN_FOR_S)


def test_a_rate_limited_key_follows_the_limiters_clock(clock: FakeClock) -> None:
    """The refusal's end is on the limiter's clock (tests/reliability/test_hostile_input.py
    moves only that one): once it passes, the key is looked up again, whatever the gate's
    clock says."""
    gate = KeyGate(clock)
    gate.found(b"k")
    gate.rate_limited(b"k", 50.2)  # a limiter whose clock reads 50.0
    assert gate.before_lookup(b"k", "1.2.3.4", 50.0) == Refusal("rate_limited", pytest.approx(0.2))
    assert gate.before_lookup(b"k", "1.2.3.4", 50.5) is None
