"""Token buckets per key (PROTOCOL §5: burst equals the per-second rate).

Kept in process memory: with several replicas each enforces the rate on the
requests it serves, so a key's effective ceiling is rate x replicas.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """A token bucket per key id; `take` returns 0 when allowed, else seconds to wait."""

    def __init__(self, clock: Callable[[], float] | None = None, max_keys: int = 100_000) -> None:
        self._now = time.monotonic if clock is None else clock
        self._buckets: dict[str, _Bucket] = {}
        self._max_keys = max_keys

    def take(self, key_id: str, rate: int) -> float:
        """Spend one token of `key_id`'s bucket; the wait in seconds if it was empty."""
        now = self._now()
        bucket = self._buckets.get(key_id)
        if bucket is None:
            if len(self._buckets) >= self._max_keys:
                self._buckets.clear()  # bounded memory; a cleared bucket starts full
            bucket = self._buckets[key_id] = _Bucket(tokens=float(rate), updated=now)
        bucket.tokens = min(float(rate), bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / rate

    @staticmethod
    def retry_after_header(wait: float) -> str:
        """Retry-After in whole seconds, at least 1."""
        return str(max(1, math.ceil(wait)))
