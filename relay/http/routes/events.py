"""`GET /v1/vaults/{v}/events?cursor=N`: the live change feed as Server-Sent Events
(PROTOCOL §15; docs/live-feed.md).

`retry: 2000` first; `event: change` with `data: {"cursor": <vault sequence>}` whenever
the vault's sequence passes the last value sent (starting from N, so at once when N is
behind); a `: ping` comment every `events_ping_s` (15 s); `event: revoked` and the end
of the stream once the device (or the key) is revoked; `event: retired` and the end once
the vault is retired (PROTOCOL §19), also on a stream opened before the retire. A hint
only, never blob data: the device pulls with its cursor. Ours (docs/live-feed.md "Blobs in
the event", feature `events-blobs`): a stream asked with `blobs=1` gets, in the change's
data, the blobs of the commits since the last value it sent (`after`) and the relay's
generation, when those commits were small and this process heard of them all.

An idle stream holds no database connection and sends no query: it waits on its
vault's watch in the process's change hub (relay.services.change_hub). The database is read once at
the start (the vault's sequence) and whenever the watch asks every waiter to re-check
(a revocation or retire notice, a LISTEN reconnect; and once at the start): the vault's
retirement and, for a revocable listener, its key and device.

Memory (issue 15: 10,000 idle streams within 200 MB): the route authorizes like any
other (Litestar parses and validates, `authorize`, the same 4xx bodies), then answers
with `EventStream`, a plain ASGI app of our own instead of Litestar's `Stream`. That
one ran an anyio task group per response (a task for the body, one listening for the
disconnect: about 6 KB a stream, measured in docs/live-feed.md). `EventStream` runs in
the request's own task: idle, it awaits the client's next ASGI message (the
disconnect) under an `asyncio.timeout` for the ping, and the vault's watch wakes it by
moving that timeout to now. No task, future or event of its own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any, Final, cast

import asyncpg
import msgspec
from litestar import Request, get
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, QueryParameter
from litestar.response.sse import ServerSentEventMessage
from litestar.types import ASGIApp, Empty, Receive, Scope, Send
from litestar.utils.scope.state import ScopeState
from msgspec import UNSET, UnsetType

from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.auth import authorize
from engram_sync.relay.http.errors import bad_request
from engram_sync.relay.http.routes.feed_support import Listener, give_back, listener_of, take_place
from engram_sync.relay.http.routes.ids import require_id
from engram_sync.relay.http.routes.sync import device_for_progress, retired_field
from engram_sync.relay.http.scope_keys import STOP_ON_SHUTDOWN
from engram_sync.relay.services.change_hub import VaultWatch
from engram_sync.relay.services.state import RelayState
from engram_sync.relay.store import feed_notify as feed_store
from engram_sync.relay.store.retire import retirement
from engram_sync.shared_format.wire import VaultRetirement

log = logging.getLogger(__name__)

RETRY_MS: Final = 2000
MEDIA_TYPE: Final = "text/event-stream"
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
# Before the end of a stream its key or account ended to admit a newer one of its own
# (relay.domain.stream_holders); a comment, so §15 readers ignore it and reconnect after `retry`.
_EVICTED: Final = ServerSentEventMessage(
    data=None, comment="evicted: a newer stream of this key or account took its place", sep=_SEP
).encode()
# The headers Litestar's `Stream` sent (docs/live-feed.md "The wire"); the request-id
# middleware adds X-Request-ID on the way out.
_HEADERS: Final = (
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # nginx: do not buffer the stream
    (b"content-type", f"{MEDIA_TYPE}; charset=utf-8".encode()),
)


def change_message(
    seq: int, *, after: int = 0, blobs: bytes | None = None, generation: str | UnsetType = UNSET
) -> bytes:
    """`event: change` carrying the vault's sequence (PROTOCOL §15) and, when given, the
    JSON array of the blobs committed in (`after`, `seq`] with the relay's generation
    (ours: wire.ChangeEvent)."""
    if blobs is None:
        data = msgspec.json.encode({"cursor": seq}).decode()
    else:
        fields: dict[str, object] = {"cursor": seq, "after": after}
        if isinstance(generation, str):  # known from the start (relay.serving.app's lifespan)
            fields["generation"] = generation
        head = msgspec.json.encode(fields)
        data = (head[:-1] + b',"blobs":' + blobs + b"}").decode()
    return ServerSentEventMessage(data=data, event="change", sep=_SEP).encode()


def retired_message(retired: VaultRetirement | UnsetType) -> bytes:
    """`event: retired` with the `retired` JSON of a pull (PROTOCOL §19)."""
    data = msgspec.json.encode(retired).decode()
    return ServerSentEventMessage(data=data, event="retired", sep=_SEP).encode()


# A new message dict for every send: middlewares may change the one they are given (the
# request-id middleware sets its headers).
async def _start(send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": list(_HEADERS)})


async def _write(send: Send, chunk: bytes, *, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": chunk, "more_body": more})


class EventStream:
    """One subscriber's stream (PROTOCOL §15), as the ASGI app the route answers with.

    It takes its place among its holder's waiters and in the hub when it starts (as a
    JSON error: 429 `too_many_streams` at its address's cap, 503 `busy` when the process
    holds `events_max_streams` waiters) and gives it back on every way out: the client
    hung up, the device was revoked, the database went away, the relay stops, a newer
    stream of its key or account evicted it, or the task was cancelled.
    """

    __slots__ = (
        "_blobs", "_cursor", "_evicted", "_listener", "_state", "_stopping", "_timeout",
        "_waker",
    )  # fmt: skip

    def __init__(
        self, state: RelayState, listener: Listener, cursor: int, *, blobs: bool = False
    ) -> None:
        self._state, self._listener, self._cursor = state, listener, cursor
        self._blobs = blobs  # `blobs=1`: small commits' blobs in the change (ours)
        self._timeout: asyncio.Timeout | None = None  # set while the stream is idle
        self._stopping = False
        self._evicted = False
        self._waker = self.wake  # one bound method, added to and discarded from the watch

    def wake(self) -> None:
        """Cut the idle wait short (the watch moved, or the relay stops)."""
        timeout = self._timeout
        if timeout is not None and not timeout.expired():
            timeout.reschedule(asyncio.get_running_loop().time())

    def stop(self) -> None:
        """End the stream soon (the relay is shutting down: devices reconnect after
        `retry`, to another process or to this one restarted)."""
        self._stopping = True
        self.wake()

    def evict(self) -> None:
        """End the stream soon: a newer one of its key or account took its place
        (relay.domain.stream_holders); the device reconnects after `retry`, with its cursor."""
        self._evicted = True
        self.stop()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state, listener = self._state, self._listener
        scope_map = cast(dict[str, Any], scope)
        # 429 or 503 (JSON) before anything was sent
        watch, place = take_place(state, listener, scope_map, self.evict)
        watch.carriers += self._blobs
        # A graceful shutdown ends the stream at once (relay.serving.connections), not after its
        # timeout; devices reconnect after `retry`.
        scope_map[STOP_ON_SHUTDOWN] = self.stop
        try:
            await _start(send)
            if await self._serve(watch, receive, send):
                # the end of the body
                await _write(send, _EVICTED if self._evicted else b"", more=False)
        finally:
            watch.carriers -= self._blobs
            give_back(state, listener, watch, place)

    async def _serve(self, watch: VaultWatch, receive: Receive, send: Send) -> bool:
        """The stream's messages until it ends; False when the client hung up (nothing
        more to send), True when the relay ends it (the end of the body follows)."""
        listener, state = self._listener, self._state
        try:
            await _write(send, _RETRY)
            watch.observe(await feed_store.vault_head(state.require_pool(), listener.vault_id))
            sent = self._cursor
            checked = None  # the watch epoch the listener was last checked at (None: not yet)
            while True:
                version = watch.version  # before reading seq and epoch: no wake is lost
                if checked != watch.epoch:
                    checked = watch.epoch
                    if listener.revocable and not await listener.still_allowed(state):
                        await _write(send, _REVOKED)
                        return True
                    # PROTOCOL §19: the retire wakes the vault's streams like a revocation
                    # (relay.store.retire); only then, or at the start, is this read
                    retired = await retirement(state.require_pool(), listener.vault_id)
                    if retired is not None:
                        await _write(send, retired_message(retired_field(retired)))
                        return True
                if watch.seq > sent:
                    after, sent = sent, watch.seq
                    blobs = watch.blobs_between(after, sent) if self._blobs else None
                    await _write(send, change_message(
                        sent, after=after, blobs=blobs, generation=state.generation
                    ))  # fmt: skip
                woken = await self._idle(watch, version, receive)
                if woken is None:
                    return False
                if self._stopping:
                    return True
                if not woken:
                    # A ping costs nothing but the write: the revocation check above runs
                    # on the watch's epoch, which revocation notices and reconnects move.
                    await _write(send, _PING)
        except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError) as exc:
            # The database is away: end the stream; the device reconnects after `retry`.
            log.warning("event stream ended: %s", type(exc).__name__)
            return True

    async def _idle(self, watch: VaultWatch, version: int, receive: Receive) -> bool | None:
        """Wait for the watch to move past `version`, the ping interval or the client's
        hang-up: True woken (or stopping), False a ping is due, None the client left."""
        if watch.version != version or self._stopping:
            return True
        try:
            async with asyncio.timeout(self._state.config.events_ping_s) as timeout:
                self._timeout = timeout
                watch.add_waker(self._waker)
                # The request's own (empty) body comes first, then only the disconnect.
                while (await receive())["type"] != "http.disconnect":
                    pass
                return None
        except TimeoutError:
            return watch.version != version or self._stopping
        finally:
            self._timeout = None
            watch.discard_waker(self._waker)


class _ScopeDiet:
    """What Litestar keeps in a request's scope that a stream need not hold for hours:
    the parsed headers (about 1.8 KB; authorization read them already) and the route's
    exception handlers, a new dict of the same handlers for every request (about 0.6
    KB), swapped for one equal dict shared by every stream."""

    def __init__(self) -> None:
        self._handlers: dict[Any, Any] | None = None

    def apply(self, request: Request[Any, Any, Any]) -> None:
        state = ScopeState.from_scope(request.scope)
        state.headers = Empty
        handlers = state.exception_handlers
        if isinstance(handlers, dict):
            if self._handlers != handlers:
                self._handlers = handlers
            state.exception_handlers = self._handlers


_diet: Final = _ScopeDiet()


_OPENAPI_200: Final = ResponseSpec(
    data_container=str,
    generate_examples=False,
    description="The vault's change hints as Server-Sent Events (PROTOCOL §15): `retry:` "
    "first, `event: change` with the vault's sequence, `: ping` comments, `event: revoked`",
    media_type=MEDIA_TYPE,
)


@get(
    "/v1/vaults/{vault_id:str}/events",
    tags=["sync"],
    media_type=MEDIA_TYPE,
    responses={200: _OPENAPI_200},
)
async def events(
    request: Request[Any, Any, Any],
    vault_id: FromPath[str],
    cursor: Annotated[int | None, QueryParameter(ge=0, le=2**63 - 1)] = None,
    blobs: Annotated[int, QueryParameter(ge=0, le=1)] = 0,
) -> ASGIApp:
    """The vault's change hints as Server-Sent Events, from `cursor` on (PROTOCOL §15);
    `blobs=1`: small commits' blobs in the change event (ours, feature `events-blobs`).
    Auth as pull; 429 `too_many_streams` when its client address holds as many as it may
    (a key or account at its cap ends its own oldest instead: relay.domain.stream_holders); 503
    `busy` when the process holds `events_max_streams` waiters."""
    state = relay_state(request)
    principal = await authorize(request, require_id(vault_id, "vault_id"))
    if cursor is None:
        raise bad_request(
            "cursor: the stream starts from a cursor (`?cursor=N`, 0 for the beginning)",
            code="invalid_request",
            field="cursor",
        )
    retired = await retirement(state.require_pool(), vault_id)
    if retired is not None:  # PROTOCOL §19: `event: retired`, then the end (410 once erased)
        if retired.erased:
            raise retired.refusal()
        return RetiredStream(retired_field(retired))
    listener = listener_of(
        request, state, vault_id, device_for_progress(request, principal.device_id), principal
    )
    _diet.apply(request)
    return EventStream(state, listener, cursor, blobs=bool(blobs))


class RetiredStream:
    """The whole stream of a retired vault (PROTOCOL §19): `retry`, then `event: retired`
    with the `retired` JSON of a pull (`{"successor", "erase_after"}`), then the end."""

    __slots__ = ("_message",)

    def __init__(self, retired: VaultRetirement | UnsetType) -> None:
        self._message = retired_message(retired)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _start(send)
        await _write(send, _RETRY + self._message, more=False)
