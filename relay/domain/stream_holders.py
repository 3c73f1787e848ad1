"""Who holds this process's event streams and long-polls, and how many each may hold.

PROTOCOL §15 (docs/live-feed.md "Who may hold how many streams"; issue 31 finding 2): a
stream holds a connection for hours and a held pull for up to 60 s, so one key opening
a thousand of them took every connection of the process. Each waiter is counted
against three holders: its key, its account (minted keys of an account; none for
operator keys) and its client address (relay.domain.client_address: X-Forwarded-For believed
only from trusted proxies, an IPv6 client as its /64). A new waiter is decided by
`admission` alone, a pure function of the three counts and the caps:

- its address holds `per_address`: refused (429 `too_many_streams`). An address is
  shared by strangers (a NAT, a campus), so one of them must not end another's streams;
- else its key holds `per_key`: the key's oldest waiter is evicted and the new one
  admitted (a stream ends with the end of its body, a held pull answers at once). The
  key's holder is one device (or one operator); its newest stream is the one it wants,
  the oldest the likeliest dead (a laptop that changed networks) or an attacker's own;
- else its account holds `per_account`: the same, the account's oldest;
- else admitted.

The caps are per process, like the connection cap they protect (relay.serving.connections):
with N replicas a key may hold N x `per_key` streams in all, and that is harmless: each
process's connections are what a holder must not exhaust, and each process counts
its own. `StreamHolders` executes the decisions; it knows no HTTP (`StreamCapError` is
answered by relay.http.errors).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sized
from dataclasses import dataclass
from typing import Final, Literal

DEFAULT_PER_KEY: Final = 8
DEFAULT_PER_ACCOUNT: Final = 32
DEFAULT_PER_ADDRESS: Final = 64
ENV_PER_KEY: Final = "ENGRAM_RELAY_EVENTS_MAX_PER_KEY"
ENV_PER_ACCOUNT: Final = "ENGRAM_RELAY_EVENTS_MAX_PER_ACCOUNT"
ENV_PER_ADDRESS: Final = "ENGRAM_RELAY_EVENTS_MAX_PER_ADDRESS"
REFUSED_RETRY_AFTER_S: Final = 30  # an address at its cap stays there until a stream ends

Dimension = Literal["key", "account", "address"]
ENV_OF: Final[dict[Dimension, str]] = {
    "key": ENV_PER_KEY,
    "account": ENV_PER_ACCOUNT,
    "address": ENV_PER_ADDRESS,
}


@dataclass(frozen=True, slots=True)
class Holder:
    """Whom a waiter counts against: its key's id, its account (None: an operator key)
    and its client address as the per-address limits count it."""

    key: str
    account: str | None
    address: str

    def names(self) -> tuple[str, ...]:
        """The holder names it counts against (also the connection guard's)."""
        names = ("key:" + self.key, "address:" + self.address)
        return names if self.account is None else (*names, "account:" + self.account)

    def name(self, dimension: Dimension) -> str | None:
        """The holder name of one dimension (None: no account)."""
        value = getattr(self, dimension)
        return None if value is None else f"{dimension}:{value}"


@dataclass(frozen=True)
class StreamCaps:
    """Waiters (streams plus held pulls) one holder may have in one process."""

    per_key: int = DEFAULT_PER_KEY
    per_account: int = DEFAULT_PER_ACCOUNT
    per_address: int = DEFAULT_PER_ADDRESS

    def __post_init__(self) -> None:
        for dimension, env in ENV_OF.items():
            if self.limit(dimension) < 1:
                raise ValueError(f"{env} must be >= 1")

    def limit(self, dimension: Dimension) -> int:
        """The cap of `dimension`."""
        cap: int = getattr(self, f"per_{dimension}")
        return cap


@dataclass(frozen=True, slots=True)
class Admit:
    """Take the new waiter."""


@dataclass(frozen=True, slots=True)
class Evict:
    """End the oldest waiter of the new one's `dimension` holder, then decide again."""

    dimension: Dimension


@dataclass(frozen=True, slots=True)
class Refuse:
    """Refuse the new waiter: its `dimension` holder holds `limit`."""

    dimension: Dimension
    limit: int


Decision = Admit | Evict | Refuse
ADMIT: Final = Admit()


def admission(key: int, account: int | None, address: int, caps: StreamCaps) -> Decision:
    """What to do with a new waiter whose key, account (None: no account) and address
    hold these many waiters now. The address first: a refusal ends nobody's stream."""
    if address >= caps.per_address:
        return Refuse("address", caps.per_address)
    if key >= caps.per_key:
        return Evict("key")
    if account is not None and account >= caps.per_account:
        return Evict("account")
    return ADMIT


def heaviest_holder(held: Mapping[str, Sized]) -> str | None:
    """The holder name (`Holder.names`) holding the most connections (the first of
    equals), or None: whose oldest stream the connection guard closes when the process
    is full (relay.serving.connections)."""
    return max(held, key=lambda name: len(held[name]), default=None)


class StreamCapError(Exception):
    """A new stream or held pull refused at a per-holder cap (relay.http.errors: 429)."""

    def __init__(self, dimension: Dimension, limit: int) -> None:
        super().__init__(f"this {dimension} holds {limit} event streams and long-polls")
        self.dimension: Dimension = dimension
        self.limit = limit
        self.env = ENV_OF[dimension]


class Place:
    """One admitted waiter: whom it counts against and how to end it early."""

    __slots__ = ("evict", "holder", "names")

    def __init__(self, holder: Holder, evict: Callable[[], None]) -> None:
        self.holder = holder
        self.names = holder.names()
        self.evict = evict


class StreamHolders:
    """The waiters of one process by holder, oldest first; executes `admission`."""

    def __init__(self, caps: StreamCaps) -> None:
        self.caps = caps
        # by holder name, oldest first (a plain dict keeps insertion order, in less memory
        # than an OrderedDict: one per holder, up to three per stream)
        self._held: dict[str, dict[Place, None]] = {}
        self.evicted = 0  # waiters ended early to admit a newer one of the same holder
        self.refused = 0

    def count(self, name: str | None) -> int:
        """Waiters `name` (e.g. "key:k_1a2b") holds now."""
        held = self._held.get(name) if name is not None else None
        return len(held) if held is not None else 0

    def enter(self, holder: Holder, evict: Callable[[], None]) -> Place:
        """Admit a waiter of `holder` (evicting its holder's oldest if need be); give its
        place back with `leave`. `StreamCapError` when refused. `evict` must only ask the
        waiter to end (synchronously, never raising): its place is taken back at once."""
        while True:
            has_account = holder.account is not None
            decision = admission(
                self.count(holder.name("key")),
                self.count(holder.name("account")) if has_account else None,
                self.count(holder.name("address")),
                self.caps,
            )
            if isinstance(decision, Refuse):
                self.refused += 1
                raise StreamCapError(decision.dimension, decision.limit)
            if isinstance(decision, Admit):
                break
            name = holder.name(decision.dimension)
            oldest = next(iter(self._held[name])) if name in self._held else None
            if oldest is None:  # cannot happen: the count said it holds some
                break
            self.leave(oldest)
            self.evicted += 1
            oldest.evict()
        place = Place(holder, evict)
        for name in place.names:
            self._held.setdefault(name, {})[place] = None
        return place

    def leave(self, place: Place) -> None:
        """Give `place` back (again: nothing happens)."""
        for name in place.names:
            held = self._held.get(name)
            if held is not None:
                held.pop(place, None)
                if not held:
                    del self._held[name]
