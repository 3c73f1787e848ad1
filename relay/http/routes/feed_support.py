"""What the event stream and the long-poll share (PROTOCOL §15): a waiter's place in the
process's change hub and among its holder's waiters (relay.domain.stream_holders), and who it
serves, re-checked without the rate limit."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Final

from litestar import Request

from engram_sync.relay.domain.api_keys import Principal, hash_key
from engram_sync.relay.domain.stream_holders import Holder, Place
from engram_sync.relay.http.client_ip import client_ip
from engram_sync.relay.http.errors import RelayError, busy
from engram_sync.relay.http.scope_keys import HOLD_CONNECTION
from engram_sync.relay.services.change_hub import ChangeHub, HubFullError, VaultWatch
from engram_sync.relay.services.state import RelayState
from engram_sync.relay.store import feed_notify as feed_store

BUSY_RETRY_AFTER_S: Final = 5


@dataclass(frozen=True, slots=True)  # slots: one per open stream (docs/live-feed.md)
class Listener:
    """Who a stream or long-poll serves: the device it speaks for and its minted key.
    A static key with no device can never be revoked; the others are re-checked with one
    query whenever the vault's watch asks for it (a revocation, a reconnect)."""

    vault_id: str
    device_id: str | None
    key_hash: bytes | None  # None for a static key (SYNC_API_KEYS: never revoked here)
    holder: Holder  # whom it counts against (relay.domain.stream_holders)

    @property
    def revocable(self) -> bool:
        """True when a revocation could end this listener's stream."""
        return self.device_id is not None or self.key_hash is not None

    async def still_allowed(self, state: RelayState) -> bool:
        """False once its device or key was revoked (PROTOCOL §10)."""
        if not self.revocable:
            return True
        return await feed_store.still_allowed(
            state.require_pool(), self.vault_id, self.device_id, self.key_hash
        )


def listener_of(
    request: Request[Any, Any, Any],
    state: RelayState,
    vault_id: str,
    device_id: str | None,
    principal: Principal,
) -> Listener:
    """The listener of an authorized request (its bearer token was checked already)."""
    token = request.headers.get("authorization", "").partition(" ")[2].strip()
    digest = hash_key(token)
    # The address as the per-address limits count it: X-Forwarded-For believed only from
    # ENGRAM_RELAY_TRUSTED_PROXIES (relay.domain.client_address), never from the client.
    holder = Holder(principal.key_id, principal.account_id, client_ip(request))
    return Listener(vault_id, device_id, None if digest in state.static_keys else digest, holder)


def join(hub: ChangeHub, vault_id: str) -> VaultWatch:
    """A place among the process's waiters, or 503 `busy` when it holds its cap."""
    try:
        return hub.join(vault_id)
    except HubFullError:
        raise busy(
            "this relay holds as many event streams and long-polls as it may "
            "(ENGRAM_RELAY_EVENTS_MAX_STREAMS); retry later, or pull on a timer",
            BUSY_RETRY_AFTER_S,
        ) from None


def take_place(
    state: RelayState,
    listener: Listener,
    scope: MutableMapping[str, Any],
    evict: Callable[[], None],
) -> tuple[VaultWatch, Place]:
    """A waiter's place among its holder's (PROTOCOL §15, relay.domain.stream_holders: its key's
    or account's oldest waiter evicted to make room, or `StreamCapError` at its address's
    cap), then in the hub (503 `busy` at the process's cap); its connection is marked as
    held by those holders for the connection guard (relay.serving.connections). Give both back
    with `give_back`; `evict` must only ask the waiter to end soon."""
    holders = state.require_holders()
    place = holders.enter(listener.holder, evict)
    try:
        watch = join(state.require_hub(), listener.vault_id)
    except BaseException:
        holders.leave(place)
        raise
    hold = scope.get(HOLD_CONNECTION)
    if callable(hold):  # served by relay.serving.connections' protocol (not in every test)
        hold(place.names)
    return watch, place


def give_back(state: RelayState, listener: Listener, watch: VaultWatch, place: Place) -> None:
    """Give back what `take_place` gave (the holder's place may be gone already: evicted)."""
    state.require_holders().leave(place)
    state.require_hub().leave(listener.vault_id, watch)


def device_revoked(listener: Listener) -> RelayError:
    """403 `device_revoked`, as a pull by a revoked device gets (PROTOCOL §10)."""
    return RelayError(
        403,
        "device_revoked",
        f"device {listener.device_id} was revoked for this vault, or this key was; "
        "ask an admin for a new device key",
    )
