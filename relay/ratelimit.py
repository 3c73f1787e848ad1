"""Token buckets per key (PROTOCOL §5: burst equals the per-second rate).

Kept in process memory: with several replicas each enforces the rate on the
requests it serves, so a key's effective ceiling is rate x replicas.

Memory is bounded without ever resetting a limit (issue 14 item 8): a bucket is dropped
only once it has been idle for one time unit, when it has refilled to its burst anyway
(burst = rate, so a full refill takes one unit), so dropping it loses nothing. While the
table is full of buckets still refilling, a key without a bucket is refused rather than
evicting someone else's: flooding the table with new keys (cheap IPv6 addresses) can no
longer clear the brute-force limits of the others.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import TTLCache

# A refill of a whole bucket takes one time unit of the limiter's clock (burst = rate).
_REFILL_UNITS = 1.0


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """A token bucket per key id; `take` returns 0 when allowed, else seconds to wait."""

    def __init__(self, clock: Callable[[], float] | None = None, max_keys: int = 100_000) -> None:
        self._now = time.monotonic if clock is None else clock
        self._buckets: TTLCache[str, _Bucket] = TTLCache(
            maxsize=max_keys, ttl=_REFILL_UNITS, timer=self._now
        )
        self._max_keys = max_keys

    def __len__(self) -> int:
        """Buckets held (expired ones dropped first)."""
        self._buckets.expire()
        return len(self._buckets)

    def take(self, key_id: str, rate: int) -> float:
        """Spend one token of `key_id`'s bucket; the wait in seconds if it was empty
        (or, while the table is full of refilling buckets, one time unit for a new key)."""
        now = self._now()
        bucket = self._buckets.get(key_id)
        if bucket is None:
            self._buckets.expire()
            if len(self._buckets) >= self._max_keys:
                return _REFILL_UNITS  # full of live limits: refuse, never evict one
            bucket = _Bucket(tokens=float(rate), updated=now)
        bucket.tokens = min(float(rate), bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        self._buckets[key_id] = bucket  # (re)sets its expiry: idle one unit from now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / rate

    @classmethod
    def per_minute(cls) -> RateLimiter:
        """A limiter whose clock runs in minutes: `rate` then means requests per minute (the
        per-IP and per-account limits of the account, pairing and handoff routes)."""
        return cls(lambda: time.monotonic() / 60.0)

    @staticmethod
    def retry_after_header(wait: float) -> str:
        """Retry-After in whole seconds, at least 1."""
        return str(max(1, math.ceil(wait)))
