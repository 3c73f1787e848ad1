"""Token buckets per key (PROTOCOL §5: burst equals the per-second rate).

Kept in process memory, and shared across processes (issue 18, deploy/SCALING.md §1):
with N relay processes alive on the database (replicas, `--workers`; counted by the
health refresh from their heartbeats, relay.store.replicas) each process refills a key's
bucket at rate/N and holds at most rate/N tokens (at least one), so the sum over the
processes is the key's rate and burst. No request queries the database for it. What it
does not cover: a process that gets more than 1/N of a key's requests refuses early
(uneven balancing, e.g. one client's keep-alive connection pinned to one replica); the
count lags a starting or stopping process by up to one refresh period (a crashed one by
three). SCALING.md §1 says what an operator does then.

Memory is bounded without ever resetting a limit (issue 14 item 8): a bucket is dropped
only once it has been idle long enough to have refilled to its burst anyway, so dropping
it loses nothing. While the table is full of buckets still refilling, a key without a
bucket is refused rather than evicting someone else's: flooding the table with new keys
(cheap IPv6 addresses) can no longer clear the brute-force limits of the others.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import TLRUCache

# A refill of a whole bucket takes one time unit of the limiter's clock (burst = rate)
# while the share is at least one token; what a new key waits while the table is full.
_REFILL_UNITS = 1.0


def _full_at(_key: str, bucket: _Bucket, _now: float) -> float:
    """When an idle bucket has refilled to its burst: from then on it may be dropped."""
    return bucket.full_at


@dataclass
class _Bucket:
    tokens: float
    updated: float
    full_at: float = 0.0


class RateLimiter:
    """A token bucket per key id; `take` returns 0 when allowed, else seconds to wait.

    `share_among(n)` makes every bucket this process's 1/n share of the key's rate."""

    def __init__(self, clock: Callable[[], float] | None = None, max_keys: int = 100_000) -> None:
        self._now = time.monotonic if clock is None else clock
        self._buckets: TLRUCache[str, _Bucket] = TLRUCache(
            maxsize=max_keys, ttu=_full_at, timer=self._now
        )
        self._max_keys = max_keys
        self._processes = 1

    @property
    def processes(self) -> int:
        """The live relay processes the rates are shared among (1 until told otherwise)."""
        return self._processes

    def share_among(self, processes: int) -> None:
        """From now on enforce 1/`processes` of every key's rate and burst (issue 18)."""
        self._processes = max(1, processes)

    def now(self) -> float:
        """The limiter's clock now (what `take`'s waits are measured in)."""
        return self._now()

    def __len__(self) -> int:
        """Buckets held (expired ones dropped first)."""
        self._buckets.expire()
        return len(self._buckets)

    def take(self, key_id: str, rate: int) -> float:
        """Spend one token of `key_id`'s bucket; the wait in seconds if it was empty
        (or, while the table is full of refilling buckets, one time unit for a new key)."""
        now = self._now()
        share = rate / self._processes  # this process's refill per time unit
        burst = max(1.0, share)  # a share below one token still lets one request through
        bucket = self._buckets.get(key_id)
        if bucket is None:
            self._buckets.expire()
            if len(self._buckets) >= self._max_keys:
                return _REFILL_UNITS  # full of live limits: refuse, never evict one
            bucket = _Bucket(tokens=burst, updated=now)
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.updated) * share)
        bucket.updated = now
        wait = 0.0
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
        else:
            wait = (1.0 - bucket.tokens) / share
        bucket.full_at = now + (burst - bucket.tokens) / share
        self._buckets[key_id] = bucket  # (re)sets its expiry: when it is full again
        return wait

    @classmethod
    def per_minute(cls) -> RateLimiter:
        """A limiter whose clock runs in minutes: `rate` then means requests per minute (the
        per-IP and per-account limits of the account, pairing and handoff routes)."""
        return cls(lambda: time.monotonic() / 60.0)

    @staticmethod
    def retry_after_header(wait: float) -> str:
        """Retry-After in whole seconds, at least 1."""
        return str(max(1, math.ceil(wait)))
