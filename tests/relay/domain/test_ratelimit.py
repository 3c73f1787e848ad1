"""Unit tests of relay/domain/ratelimit.py with an injected clock (PROTOCOL §5: burst = rate)."""

from __future__ import annotations

import pytest

from engram_sync.relay.domain.ratelimit import RateLimiter


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_burst_equals_the_rate_then_the_wait_is_reported(clock: FakeClock) -> None:
    limiter = RateLimiter(clock=clock)
    assert [limiter.take("k", 5) for _ in range(5)] == [0.0] * 5
    wait = limiter.take("k", 5)
    assert wait == pytest.approx(1 / 5)
    # A refused request spends nothing: the wait does not grow while we are refused.
    assert limiter.take("k", 5) == pytest.approx(1 / 5)


def test_tokens_refill_at_the_rate(clock: FakeClock) -> None:
    limiter = RateLimiter(clock=clock)
    for _ in range(4):
        limiter.take("k", 4)
    assert limiter.take("k", 4) > 0
    clock.advance(0.25)  # one token at 4/s
    assert limiter.take("k", 4) == 0.0
    assert limiter.take("k", 4) > 0
    clock.advance(0.125)  # half a token
    assert limiter.take("k", 4) == pytest.approx(0.125)


def test_refill_is_capped_at_the_burst(clock: FakeClock) -> None:
    limiter = RateLimiter(clock=clock)
    limiter.take("k", 3)
    clock.advance(3600)
    assert [limiter.take("k", 3) for _ in range(3)] == [0.0] * 3
    assert limiter.take("k", 3) > 0


def test_keys_have_separate_buckets(clock: FakeClock) -> None:
    limiter = RateLimiter(clock=clock)
    assert limiter.take("a", 1) == 0.0
    assert limiter.take("a", 1) > 0
    assert limiter.take("b", 1) == 0.0


@pytest.mark.parametrize(
    ("wait", "header"), [(0.0001, "1"), (0.5, "1"), (1.0, "1"), (1.01, "2"), (7.2, "8")]
)
def test_retry_after_is_whole_seconds_at_least_one(wait: float, header: str) -> None:
    assert RateLimiter.retry_after_header(wait) == header


def test_a_flood_of_new_keys_never_resets_anothers_limit(clock: FakeClock) -> None:
    """Issue 14 item 8: filling the table used to clear every bucket, so 100k cheap new
    keys (IPv6 addresses) reset the victim's brute-force limit."""
    limiter = RateLimiter(clock=clock, max_keys=100)
    for _ in range(3):
        limiter.take("victim", 3)
    assert limiter.take("victim", 3) > 0  # exhausted
    refused = [limiter.take(f"flood-{i}", 3) for i in range(500)]
    assert refused.count(0.0) == 99  # the table fills up to its bound ...
    assert all(wait > 0 for wait in refused[99:])  # ... then new keys are refused
    assert len(limiter) == 100
    assert limiter.take("victim", 3) > 0  # still exhausted: nothing was reset


def test_idle_buckets_are_dropped_once_full_so_new_keys_fit_again(clock: FakeClock) -> None:
    """The positive case: a bucket idle for one refill period is full, dropping it loses
    nothing, and its room goes to a new key."""
    limiter = RateLimiter(clock=clock, max_keys=10)
    for i in range(10):
        limiter.take(f"k{i}", 2)
    assert limiter.take("newcomer", 2) > 0  # full of refilling buckets
    clock.advance(1.01)  # every bucket has refilled
    assert limiter.take("newcomer", 2) == 0.0
    assert len(limiter) == 1
    # a dropped key comes back with a full burst, exactly what it had refilled to
    assert [limiter.take("k0", 2) for _ in range(3)] == [0.0, 0.0, pytest.approx(0.5)]


# --- issue 18: a key's rate shared among the live relay processes (deploy/SCALING.md §1) ---


def test_shared_among_two_processes_each_enforces_half_the_rate_and_burst(
    clock: FakeClock,
) -> None:
    limiter = RateLimiter(clock=clock)
    limiter.share_among(2)
    assert limiter.processes == 2
    assert [limiter.take("k", 10) for _ in range(5)] == [0.0] * 5  # burst 10 / 2
    assert limiter.take("k", 10) == pytest.approx(1 / 5)  # refill 5/s
    clock.advance(0.2)
    assert limiter.take("k", 10) == 0.0
    assert limiter.take("k", 10) > 0


def test_alone_a_process_gets_the_full_rate_again(clock: FakeClock) -> None:
    """The positive case: once the other process is gone the share grows back."""
    limiter = RateLimiter(clock=clock)
    limiter.share_among(2)
    assert [limiter.take("k", 10) for _ in range(6)].count(0.0) == 5
    limiter.share_among(1)
    clock.advance(1.0)
    assert [limiter.take("k", 10) for _ in range(11)].count(0.0) == 10


def test_a_share_below_one_token_still_lets_one_request_through(clock: FakeClock) -> None:
    limiter = RateLimiter(clock=clock)
    limiter.share_among(8)  # 2/s over 8 processes: 0.25/s each
    assert limiter.take("k", 2) == 0.0
    assert limiter.take("k", 2) == pytest.approx(4.0)
    clock.advance(2.0)  # half a token: still refused, and the idle bucket is kept
    assert limiter.take("k", 2) == pytest.approx(2.0)
    clock.advance(2.0)
    assert limiter.take("k", 2) == 0.0


def test_no_share_below_one_process(clock: FakeClock) -> None:
    limiter = RateLimiter(clock=clock)
    limiter.share_among(0)
    assert limiter.processes == 1
