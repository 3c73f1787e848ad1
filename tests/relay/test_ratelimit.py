"""Unit tests of relay/ratelimit.py with an injected clock (PROTOCOL §5: burst = rate)."""

from __future__ import annotations

import pytest

from relay.ratelimit import RateLimiter


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


def test_bounded_memory_starts_over_with_full_buckets(clock: FakeClock) -> None:
    limiter = RateLimiter(clock=clock, max_keys=2)
    limiter.take("a", 1)
    limiter.take("b", 1)
    assert limiter.take("a", 1) > 0
    limiter.take("c", 1)  # a third key clears the table
    assert limiter.take("a", 1) == 0.0


@pytest.mark.parametrize(
    ("wait", "header"), [(0.0001, "1"), (0.5, "1"), (1.0, "1"), (1.01, "2"), (7.2, "8")]
)
def test_retry_after_is_whole_seconds_at_least_one(wait: float, header: str) -> None:
    assert RateLimiter.retry_after_header(wait) == header
