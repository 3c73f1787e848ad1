"""`GET /v1/vaults/{v}/events?cursor=N`: the live change feed as Server-Sent Events
(PROTOCOL §15; docs/live-feed.md).

`retry: 2000` first; `event: change` with `data: {"cursor": <vault sequence>}` whenever
the vault's sequence passes the last value sent (starting from N, so at once when N is
behind); a `: ping` comment every `events_ping_s` (15 s); `event: revoked` and the end
of the stream once the device (or the key) is revoked. A hint only, never blob data:
the device pulls with its cursor.

An idle stream holds no database connection and sends no query: it waits on its
vault's watch in the process's change hub (relay.feed). The database is read once at
the start (the vault's sequence) and, for a revocable listener, once whenever the
watch asks every waiter to re-check (a revocation notice, a LISTEN reconnect).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, Final

import asyncpg
import msgspec
from litestar import Request, get
from litestar.background_tasks import BackgroundTask
from litestar.params import FromPath, QueryParameter
from litestar.response import Stream
from litestar.response.sse import ServerSentEventMessage

from engram_sync.relay.auth import authorize
from engram_sync.relay.errors import bad_request
from engram_sync.relay.feed import ChangeHub, VaultWatch
from engram_sync.relay.routes.feed_support import Listener, join, listener_of
from engram_sync.relay.routes.ids import require_id
from engram_sync.relay.routes.sync import device_for_progress
from engram_sync.relay.state import RelayState, relay_state
from engram_sync.relay.store import feed as feed_store

log = logging.getLogger(__name__)

RETRY_MS: Final = 2000
_SEP: Final = "\n"
_RETRY: Final = ServerSentEventMessage(data=None, retry=RETRY_MS, sep=_SEP).encode()
_PING: Final = ServerSentEventMessage(data=None, comment="ping", sep=_SEP).encode()
_REVOKED_BODY: Final = msgspec.json.encode(
    {
        "error": "this device (or this key) was revoked for this vault; "
        "ask an admin for a new device key",
        "code": "device_revoked",
    }
).decode()
_REVOKED: Final = ServerSentEventMessage(data=_REVOKED_BODY, event="revoked", sep=_SEP).encode()


def change_message(seq: int) -> bytes:
    """`event: change` carrying the vault's sequence (PROTOCOL §15)."""
    data = msgspec.json.encode({"cursor": seq}).decode()
    return ServerSentEventMessage(data=data, event="change", sep=_SEP).encode()


class _Place:
    """The stream's place in the hub, given back once (by the stream's end, or by the
    response's background task when the stream never started)."""

    def __init__(self, hub: ChangeHub, vault_id: str, watch: VaultWatch) -> None:
        self._hub, self._vault_id, self.watch = hub, vault_id, watch
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._hub.leave(self._vault_id, self.watch)

    async def release_after_response(self) -> None:
        self.release()


async def _changes(
    state: RelayState, place: _Place, listener: Listener, cursor: int
) -> AsyncIterator[bytes]:
    watch = place.watch
    ping_s = state.config.events_ping_s
    try:
        yield _RETRY
        watch.observe(await feed_store.vault_head(state.require_pool(), listener.vault_id))
        sent = cursor
        checked = None  # the watch epoch the listener was last checked at (None: not yet)
        while True:
            version = watch.version  # before reading seq and epoch: no wake is lost
            if listener.revocable and checked != watch.epoch:
                checked = watch.epoch
                if not await listener.still_allowed(state):
                    yield _REVOKED
                    return
            if watch.seq > sent:
                sent = watch.seq
                yield change_message(sent)
            if not await watch.wait(version, ping_s):
                # A ping costs nothing but the write: the revocation check above runs on
                # the watch's epoch, which revocation notices and reconnects move.
                yield _PING
    except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError) as exc:
        # The database is away: end the stream; the device reconnects after `retry`.
        log.warning("event stream ended: %s", type(exc).__name__)
    finally:
        place.release()


@get("/v1/vaults/{vault_id:str}/events", tags=["sync"])
async def events(
    request: Request[Any, Any, Any],
    vault_id: FromPath[str],
    cursor: Annotated[int | None, QueryParameter(ge=0, le=2**63 - 1)] = None,
) -> Stream:
    """The vault's change hints as Server-Sent Events, from `cursor` on (PROTOCOL §15).
    Auth as pull; 503 `busy` when the process holds `events_max_streams` waiters."""
    state = relay_state(request)
    principal = await authorize(request, require_id(vault_id, "vault_id"))
    if cursor is None:
        raise bad_request(
            "cursor: the stream starts from a cursor (`?cursor=N`, 0 for the beginning)",
            code="invalid_request",
            field="cursor",
        )
    listener = listener_of(
        request, state, vault_id, device_for_progress(request, principal.device_id)
    )
    hub = state.require_hub()
    place = _Place(hub, vault_id, join(hub, vault_id))
    return Stream(
        _changes(state, place, listener, cursor),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(place.release_after_response),
    )
