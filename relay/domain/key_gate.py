"""Refusals decided before a key's database lookup (PROTOCOL §5, §10; issue 36).

Every request with a minted key costs one database query to find the key (relay.http.auth,
relay.store.minted_keys.lookup) before its rate limit (relay.domain.ratelimit) can refuse
it. Under a stream hog (bench.stream_hog: one key opening ~430 connections a second) the
relay spent its CPU on those lookups, each followed by a 429. The gate answers from process
memory, before the lookup, what the lookup would only repeat:

- a key refused by its rate limit gets 429 again until its bucket holds a token (the wait
  the limiter gave), without a lookup;
- a key the database did not know, or knew as revoked, gets 401 again for `UNKNOWN_FOR_S`
  without a lookup (a key minted in that window works once it passes);
- per client address, lookups that found no live key are themselves limited
  (`FAILED_LOOKUPS_PER_S`, burst the same): past that, the address's requests get 429
  before any lookup, except for keys that passed a lookup in the last `KNOWN_FOR_S` (an
  honest key behind the same address keeps working; its lookup still runs, so a
  revocation still takes effect at once).

So a flood of bad keys from one address costs at most `FAILED_LOOKUPS_PER_S` lookups, then
at most twice that a second (a failed lookup is known only after it ran: the one that
finds the budget empty ran too), per process, whatever it sends. Nothing here grants
access: a key the gate lets through is looked up as before. Memory is bounded
(`MAX_ENTRIES` per table, least recently used dropped first: a dropped entry costs one more
lookup, nothing else).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from cachetools import TLRUCache, TTLCache

from engram_sync.relay.domain.ratelimit import RateLimiter

UNKNOWN_FOR_S: Final = 2.0
FAILED_LOOKUPS_PER_S: Final = 20
KNOWN_FOR_S: Final = 60.0
MAX_ENTRIES: Final = 100_000


Kind = Literal["unknown", "rate_limited"]


@dataclass(frozen=True)
class Refusal:
    """What the gate answers instead of a lookup: 401 `unknown` or 429 `rate_limited`,
    `wait` seconds (Retry-After) before asking again is worth it."""

    kind: Kind
    wait: float


def _until(_key: object, until: float, _now: float) -> float:
    return until


class KeyGate:
    """One process's memory of recent refusals, by key hash and by client address.

    A rate-limit refusal's end is kept on the rate limiter's own clock (`limiter_now`, what
    its waits are measured in), so the gate never refuses a request the limiter would take;
    the rest on the gate's clock."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._now = time.monotonic if clock is None else clock
        self._unknown: TLRUCache[bytes, float] = TLRUCache(  # key hash -> until
            maxsize=MAX_ENTRIES, ttu=_until, timer=self._now
        )
        # key hash -> until, on the limiter's clock; dropped after a minute of the gate's
        # (a longer wait then costs one lookup more)
        self._limited: TTLCache[bytes, float] = TTLCache(
            maxsize=MAX_ENTRIES, ttl=KNOWN_FOR_S, timer=self._now
        )
        self._known: TTLCache[bytes, bool] = TTLCache(
            maxsize=MAX_ENTRIES, ttl=KNOWN_FOR_S, timer=self._now
        )
        self._failures = RateLimiter(self._now, max_keys=MAX_ENTRIES)
        self._blocked: TLRUCache[str, float] = TLRUCache(  # address -> until
            maxsize=MAX_ENTRIES, ttu=_until, timer=self._now
        )

    def before_lookup(self, digest: bytes, address: str, limiter_now: float) -> Refusal | None:
        """The refusal of a request with key hash `digest` from `address`, or None: look
        the key up. `limiter_now`: the key rate limiter's clock now."""
        now = self._now()
        until = self._unknown.get(digest)
        if until is not None and until > now:
            return Refusal("unknown", until - now)
        until = self._limited.get(digest)
        if until is not None and until > limiter_now:
            return Refusal("rate_limited", until - limiter_now)
        if digest not in self._known:
            until = self._blocked.get(address)
            if until is not None and until > now:
                return Refusal("rate_limited", until - now)
        return None

    def found(self, digest: bytes) -> None:
        """The lookup found a live key."""
        self._known[digest] = True

    def not_found(self, digest: bytes, address: str) -> None:
        """The lookup found no key, or a revoked one: 401 for a while, and one failed
        lookup on `address`'s budget."""
        now = self._now()
        self._known.pop(digest, None)
        self._unknown[digest] = now + UNKNOWN_FOR_S
        wait = self._failures.take(address, FAILED_LOOKUPS_PER_S)
        if wait > 0:
            self._blocked[address] = now + wait

    def rate_limited(self, digest: bytes, until: float) -> None:
        """The key's rate limit refused it until `until` (on the limiter's clock)."""
        self._limited[digest] = until
