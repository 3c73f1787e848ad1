"""Connection guards around uvicorn's HTTP/1.1 protocol: read timeouts and a connection cap.

uvicorn (0.54) arms no timer on a new connection and none while a request's headers or
body are arriving: only the keep-alive timer after a response. A client that sends half
a request line and then nothing holds its connection (and a file descriptor) for ever;
~21,000 of them from one client used up a relay's 20,000 descriptors (issue 14 item 6).
`GuardedHttpProtocol` is uvicorn's httptools protocol with three guards added:

- header timeout: a connection waiting for a request's headers (new, half sent, or idle
  after a keep-alive response once a byte of the next request came) is closed when they
  are not complete within `header_timeout_s` (counted from the connection's opening or
  from the first byte after a response; progress does not extend it, so dribbling a byte
  at a time does not either). Headers larger than `MAX_HEADER_BYTES` are refused (431):
  httptools itself buffers headers of any size.
- body timeout: a request whose body stops arriving for `body_timeout_s` (while the app
  is reading it: a paused read is the relay's doing, not the client's) is answered 408
  and closed; the app sees a disconnect (relay.http.errors answers it 408, not 500).
- connection cap: a process holds at most `max_connections`. A new connection over the
  cap closes the oldest one that is waiting for headers after sending something (a
  half-sent request, or an idle keep-alive connection), so an attacker's half-open
  connections make room for a client that sends its request at once. A connection that
  has not sent a byte yet is spared for `fresh_grace_s` (its request may be in the
  kernel's buffer, unread: a burst of accepts must not close a client before the relay
  read it). Next, a connection held by a long-lived response (an event stream or a held
  pull, which marked itself through `HOLD_CONNECTION` with its holders: key, account,
  client address, relay.domain.stream_holders) is closed: the oldest of the holder that holds
  the most (issue 31 finding 2: one key's streams took every connection, and every other
  client's push got 503). Only when nothing can be closed is the new one refused (503).
  Refusing new connections instead would let an attacker who keeps the cap full lock
  every client out.

Never a parser of our own: httptools parses, uvicorn runs the ASGI cycle; this module
only watches the callbacks' order and the clock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from engram_sync.relay.domain.stream_holders import heaviest_holder
from engram_sync.relay.http.scope_keys import HOLD_CONNECTION, STOP_ON_SHUTDOWN

log = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT_S: Final = 10.0
DEFAULT_BODY_TIMEOUT_S: Final = 30.0
DEFAULT_MAX_CONNECTIONS: Final = 1000
# Request line plus headers; the relay's own requests send well under 2 KiB.
MAX_HEADER_BYTES: Final = 64 * 1024
# Descriptors a process needs besides its client connections: listening sockets, the
# database pool, log files, the interpreter's own.
FD_MARGIN: Final = 256
REPORT_EVERY_S: Final = 60.0
# How long a connection that has sent nothing yet is spared by the cap (at most; never
# more than half the header timeout).
FRESH_GRACE_S: Final = 0.5

ENV_HEADER_TIMEOUT: Final = "ENGRAM_RELAY_HEADER_TIMEOUT_S"
ENV_BODY_TIMEOUT: Final = "ENGRAM_RELAY_BODY_TIMEOUT_S"
ENV_MAX_CONNECTIONS: Final = "ENGRAM_RELAY_MAX_CONNECTIONS"


@dataclass(frozen=True)
class ConnectionLimits:
    """The guards' settings, per process (each `--workers` process has its own cap)."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    @property
    def fresh_grace_s(self) -> float:
        """How long the cap spares a connection that has not sent a byte yet."""
        return min(FRESH_GRACE_S, self.header_timeout_s / 2)

    def __post_init__(self) -> None:
        if not self.header_timeout_s > 0:
            raise ValueError(f"{ENV_HEADER_TIMEOUT} must be > 0, got {self.header_timeout_s}")
        if not self.body_timeout_s > 0:
            raise ValueError(f"{ENV_BODY_TIMEOUT} must be > 0, got {self.body_timeout_s}")
        if self.max_connections < 1:
            raise ValueError(f"{ENV_MAX_CONNECTIONS} must be >= 1, got {self.max_connections}")


def limits_from_env(env: Mapping[str, str] | None = None) -> ConnectionLimits:
    """`ENGRAM_RELAY_HEADER_TIMEOUT_S`, `..._BODY_TIMEOUT_S`, `..._MAX_CONNECTIONS`; a bad
    value is a ValueError naming the variable."""
    source = os.environ if env is None else env

    def number(name: str, default: float) -> float:
        raw = source.get(name, "").strip()
        try:
            return float(raw) if raw else default
        except ValueError:
            raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None

    raw_cap = source.get(ENV_MAX_CONNECTIONS, "").strip()
    try:
        cap = int(raw_cap) if raw_cap else DEFAULT_MAX_CONNECTIONS
    except ValueError:
        raise ValueError(f"{ENV_MAX_CONNECTIONS} must be an integer, got {raw_cap!r}") from None
    return ConnectionLimits(
        header_timeout_s=number(ENV_HEADER_TIMEOUT, DEFAULT_HEADER_TIMEOUT_S),
        body_timeout_s=number(ENV_BODY_TIMEOUT, DEFAULT_BODY_TIMEOUT_S),
        max_connections=cap,
    )


def ensure_fd_limit(limits: ConnectionLimits) -> int:
    """Raise this process's soft descriptor limit (workers inherit it) to the cap plus
    `FD_MARGIN` when it is lower, as far as the hard limit allows; warn when the hard
    limit is too low. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = limits.max_connections + FD_MARGIN
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft != resource.RLIM_INFINITY and soft < need:
        log.warning(
            "the open-file limit (%d) is below %s + %d; lower the cap or raise the limit "
            "(LimitNOFILE in the systemd unit, ulimit -n)",
            soft,
            ENV_MAX_CONNECTIONS,
            FD_MARGIN,
            extra={"fd_limit": soft, "max_connections": limits.max_connections},
        )
    return int(soft)


class GuardedConfig(uvicorn.Config):
    """uvicorn's config plus the guards' limits (pickled to `--workers` processes with it)."""

    def __init__(self, app: Any, *, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(app, http=GuardedHttpProtocol, **kwargs)
        self.connection_limits = limits


@dataclass
class _Gate:
    """One server's connections (one per process): the counted ones; of those waiting for
    request headers, the ones that sent something (the cap closes those first, oldest
    first) and the fresh ones that have not (with the loop time they arrived)."""

    open: set[GuardedHttpProtocol] = field(default_factory=set)
    waiting: OrderedDict[GuardedHttpProtocol, None] = field(default_factory=OrderedDict)
    fresh: OrderedDict[GuardedHttpProtocol, float] = field(default_factory=OrderedDict)
    # connections held by a long-lived response, by holder name, oldest first
    held: dict[str, dict[GuardedHttpProtocol, None]] = field(default_factory=dict)
    holders_of: dict[GuardedHttpProtocol, tuple[str, ...]] = field(default_factory=dict)
    tally: dict[str, int] = field(default_factory=dict)
    reported_at: float = field(default_factory=time.monotonic)

    def hold(self, conn: GuardedHttpProtocol, names: tuple[str, ...]) -> None:
        """`conn` serves a long-lived response of the holders `names`."""
        self.unhold(conn)
        self.holders_of[conn] = names
        for name in names:
            self.held.setdefault(name, {})[conn] = None

    def unhold(self, conn: GuardedHttpProtocol) -> None:
        """`conn` no longer serves one (nothing happens when it did not)."""
        for name in self.holders_of.pop(conn, ()):
            of_name = self.held.get(name)
            if of_name is not None:
                of_name.pop(conn, None)
                if not of_name:
                    del self.held[name]

    def held_victim(self) -> GuardedHttpProtocol | None:
        """The oldest held connection of the heaviest holder, or None."""
        name = heaviest_holder(self.held)
        return None if name is None else next(iter(self.held[name]))

    def victim(self, now: float, grace: float) -> GuardedHttpProtocol | None:
        """The connection to close to make room: the oldest waiting one that sent
        something, else the oldest fresh one past its grace, else none."""
        for conn in self.waiting:
            return conn
        for conn, since in self.fresh.items():
            return conn if now - since >= grace else None  # the oldest is the first
        return None

    def count(self, event: str) -> None:
        """Tally a guard's action; one warning a minute at most sums them up (an attack
        makes thousands a second)."""
        self.tally[event] = self.tally.get(event, 0) + 1
        now = time.monotonic()
        if now - self.reported_at >= REPORT_EVERY_S:
            log.warning(
                "connection guards acted: %s",
                ", ".join(f"{n} {name}" for name, n in sorted(self.tally.items())),
                extra={f"conn_{name}": n for name, n in self.tally.items()}
                | {"open_connections": len(self.open)},
            )
            self.tally.clear()
            self.reported_at = now


_GATES: weakref.WeakKeyDictionary[ServerState, _Gate] = weakref.WeakKeyDictionary()


def gate_for(server_state: ServerState) -> _Gate:
    """The gate of the server `server_state` belongs to."""
    gate = _GATES.get(server_state)
    if gate is None:
        gate = _GATES[server_state] = _Gate()
    return gate


def _error_response(status: int, code: str, message: str, **headers: str) -> bytes:
    """A complete `connection: close` response with the relay's JSON error body
    (PROTOCOL §5), for the guards that answer before or instead of the app."""
    body = json.dumps({"error": message, "code": code}).encode()
    lines = [STATUS_LINE[status], b"content-type: application/json\r\n"]
    lines += [f"{name.replace('_', '-')}: {value}\r\n".encode() for name, value in headers.items()]
    lines += [b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body]
    return b"".join(lines)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header/body read timeouts and the cap."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = getattr(config, "connection_limits", None)
        self.limits = limits if isinstance(limits, ConnectionLimits) else ConnectionLimits()
        self.gate = gate_for(server_state)
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._header_bytes = 0  # bytes received while waiting for the current headers
        self._message_begun = False  # a request line has started arriving
        self._body_pending = False  # headers complete, body not yet
        self._body_progress_at = 0.0

    # -- connection lifetime -----------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        gate = self.gate
        now = self.loop.time()
        if len(gate.open) >= self.limits.max_connections:
            victim, event = gate.victim(now, self.limits.fresh_grace_s), "closed_waiting_at_cap"
            if victim is None:  # then a stream or held pull, the heaviest holder's oldest
                victim, event = gate.held_victim(), "closed_held_at_cap"
            if victim is None:  # requests in progress, or connections too new to judge
                gate.count("refused_at_cap")
                self._close(
                    _error_response(
                        503,
                        "overloaded",
                        "the relay has too many connections open; retry shortly",
                        retry_after="1",
                    )
                )
                return
            gate.count(event)
            victim._close()
        gate.open.add(self)
        self._header_bytes = 0
        self._message_begun = False
        gate.fresh[self] = now
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        super().connection_lost(exc)

    def _forget(self) -> None:
        self.gate.unhold(self)
        self.gate.open.discard(self)
        self.gate.waiting.pop(self, None)
        self.gate.fresh.pop(self, None)
        self._cancel_header_timer()
        self._cancel_body_timer()

    def _close(self, response: bytes = b"") -> None:
        """Close now (with a last response if given); uncounted at once, so the cap can
        admit the connection that made room before the transport calls back."""
        self._forget()
        if self.transport.is_closing():
            return
        if response:
            self.transport.write(response)
        self.transport.close()

    # -- the waiting state (no request whose headers are complete) ---------------------

    def _wait_for_headers(self) -> None:
        self._header_bytes = 0
        self._message_begun = False
        self.gate.waiting[self] = None

    def _awaits_headers(self) -> bool:
        # Not while an early-answered request's body is still coming in.
        return self in self.gate.waiting and not self._body_pending

    def data_received(self, data: bytes) -> None:
        if self.gate.fresh.pop(self, None) is not None:  # its first bytes
            self.gate.waiting[self] = None
        if self._awaits_headers():
            self._header_bytes += len(data)
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self._body_pending:
            self._body_progress_at = self.loop.time()
            if self._body_timer is None:
                self._arm_body_timer(self.limits.body_timeout_s)
        if self._awaits_headers():
            if self._header_bytes > MAX_HEADER_BYTES:
                self.gate.count("refused_large_headers")
                message = f"request line and headers exceed {MAX_HEADER_BYTES} bytes"
                self._close(_error_response(431, "headers_too_large", message))
                return
            # uvicorn cancels its keep-alive timer on any byte (and never re-arms it
            # after the body of an early-answered request): from here the header
            # timeout is what closes a connection whose next request never completes.
            self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._message_begun = True
        cast(dict[str, Any], self.scope)[HOLD_CONNECTION] = self._hold

    def _hold(self, names: tuple[str, ...]) -> None:
        """The app's long-lived response of holders `names` (HOLD_CONNECTION)."""
        if not self.transport.is_closing():
            self.gate.hold(self, names)

    def on_headers_complete(self) -> None:
        self.gate.waiting.pop(self, None)
        self.gate.fresh.pop(self, None)
        self._cancel_header_timer()
        self._body_pending = True  # until on_message_complete, in this feed or a later one
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._body_pending = False
        self._cancel_body_timer()
        super().on_message_complete()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown of this connection, and a response in flight that
        asked for it (`STOP_ON_SHUTDOWN`) is told to end now."""
        super().shutdown()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            stop = cycle.scope.get(STOP_ON_SHUTDOWN)
            if callable(stop):
                stop()

    def on_response_complete(self) -> None:
        self.gate.unhold(self)
        super().on_response_complete()
        # uvicorn armed its keep-alive timer: the connection idles until the next request.
        if self.timeout_keep_alive_task is not None and not self.transport.is_closing():
            self._wait_for_headers()

    # -- timers ------------------------------------------------------------------------

    def _arm_header_timer(self) -> None:
        if self._header_timer is None and not self.transport.is_closing():
            self._header_timer = self.loop.call_later(
                self.limits.header_timeout_s, self._header_timed_out
            )

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        self.gate.count("closed_header_timeout")
        if not self._message_begun:  # a new or idle connection that sent nothing
            self._close()
            return
        seconds = f"{self.limits.header_timeout_s:g}"
        message = f"the request headers did not arrive within {seconds} s"
        self._close(_error_response(408, "header_timeout", message))

    def _arm_body_timer(self, delay: float) -> None:
        self._body_timer = self.loop.call_later(delay, self._body_check)

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_check(self) -> None:
        self._body_timer = None
        if not self._body_pending or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.flow.read_paused:  # the app has not read what came: not the client's stall
            self._body_progress_at = now
        idle = now - self._body_progress_at
        if idle < self.limits.body_timeout_s:
            self._arm_body_timer(self.limits.body_timeout_s - idle)
            return
        self.gate.count("closed_body_timeout")
        seconds = f"{self.limits.body_timeout_s:g}"
        message = f"the request body stopped arriving for {seconds} s"
        started = self.cycle is not None and self.cycle.response_started
        self._close(b"" if started else _error_response(408, "body_timeout", message))
