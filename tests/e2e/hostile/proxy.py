"""A lying relay: an HTTP proxy between the real client and the real relay process that can
rewrite any answer (issue 13).

The proxy is a small ASGI app served by uvicorn on a loopback port. Every request is
forwarded to the real relay; the first rule whose method and path match may then replace
the answer (status, body, headers), delay it, or answer without forwarding at all. With no
rule it is an honest proxy, so each attack test runs its honest counterpart through the
same machinery.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import uvicorn

from tests.relay.conftest import free_port


@dataclass
class Exchange:
    """One request and the real relay's answer to it (None when not forwarded)."""

    method: str
    path: str
    query: dict[str, str]
    request_body: bytes
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        return msgspec.json.decode(self.body)

    def request_json(self) -> Any:
        return msgspec.json.decode(self.request_body)


@dataclass
class Answer:
    """What the client gets instead of the relay's answer."""

    status: int = 200
    body: bytes | Any = b""  # bytes as they are, anything else encoded as JSON
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "application/json"})
    delay: float = 0.0
    # sent as `chunks` copies of `body` without a Content-Length (chunked), when > 0
    chunks: int = 0
    chunk_delay: float = 0.0
    # sent one by one, each after its delay, without a Content-Length, then the stream is
    # held open `hold` more seconds (a scripted event stream, PROTOCOL §15)
    pieces: list[tuple[float, bytes]] | None = None
    hold: float = 0.0

    def raw(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        return msgspec.json.encode(self.body)


# A rule's action: the exchange in, an Answer out, or None to pass the real answer on.
Action = Callable[[Exchange], "Answer | None"]


@dataclass
class Rule:
    method: str
    path: re.Pattern[str]
    action: Action
    forward: bool = True
    times: int | None = None  # None: every matching request
    hits: int = 0


class HostileProxy:
    """uvicorn serving the proxy in a thread; `on(...)` adds a lie, `honest()` drops them."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.rules: list[Rule] = []
        self.log: list[Exchange] = []
        self._lock = threading.Lock()
        self._http: httpx.AsyncClient | None = None
        self.server = uvicorn.Server(
            uvicorn.Config(
                self._app,
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                interface="asgi3",
                # `stop` cancels a stream still open (a watch's) after 2 s instead of waiting
                # for it: the join below timed out at 30 s after a watch test (issue 32)
                timeout_graceful_shutdown=2,
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    # -- rules ------------------------------------------------------------------------------

    def on(
        self,
        method: str,
        path: str,
        action: Action,
        *,
        forward: bool = True,
        times: int | None = None,
    ) -> Rule:
        """Rewrite answers to `method` on paths matching the regex `path` (searched)."""
        rule = Rule(method.upper(), re.compile(path), action, forward, times)
        with self._lock:
            self.rules.append(rule)
        return rule

    def honest(self) -> None:
        with self._lock:
            self.rules.clear()

    def requests(self, method: str, path: str) -> list[Exchange]:
        pattern = re.compile(path)
        with self._lock:
            return [e for e in self.log if e.method == method and pattern.search(e.path)]

    def _rule_for(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.method != method or not rule.path.search(path):
                    continue
                if rule.times is not None and rule.hits >= rule.times:
                    continue
                rule.hits += 1
                return rule
        return None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> HostileProxy:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("proxy did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    # -- the ASGI app -----------------------------------------------------------------------

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self._http = httpx.AsyncClient(base_url=self.upstream, timeout=60)
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if self._http is not None:
                        await self._http.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        method, path = scope["method"], scope["path"]
        raw_query = scope.get("query_string", b"").decode()
        query = dict(httpx.QueryParams(raw_query))
        exchange = Exchange(method, path, query, body)
        rule = self._rule_for(method, path)
        if rule is None or rule.forward:
            assert self._http is not None
            sent = [
                (k.decode(), v.decode())
                for k, v in scope["headers"]
                if k.lower() not in (b"host", b"content-length")
            ]
            upstream = await self._http.request(
                method, path, params=raw_query or None, content=body, headers=sent
            )
            exchange.status = upstream.status_code
            exchange.headers = {
                k: v
                for k, v in upstream.headers.items()
                if k.lower() not in ("content-length", "content-encoding", "transfer-encoding")
            }
            exchange.body = upstream.content
        with self._lock:
            self.log.append(exchange)
        answer = rule.action(exchange) if rule is not None else None
        if answer is None:
            status, headers, out = exchange.status, exchange.headers, exchange.body
        else:
            if answer.delay:
                await asyncio.sleep(answer.delay)
            if answer.chunks:
                await self._stream(send, answer)
                return
            if answer.pieces is not None:
                await self._pieces(send, receive, answer)
                return
            status, headers, out = answer.status, answer.headers, answer.raw()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(k.encode(), v.encode()) for k, v in headers.items()]
                + [(b"content-length", str(len(out)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": out})

    async def _pieces(self, send: Any, receive: Any, answer: Answer) -> None:
        headers = [(k.encode(), v.encode()) for k, v in answer.headers.items()]
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        try:
            for delay, piece in answer.pieces or []:
                if delay:
                    await asyncio.sleep(delay)
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            if answer.hold:  # until the client hangs up, at most `hold` seconds
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_disconnected(receive), answer.hold)
            await send({"type": "http.response.body", "body": b""})
        except OSError:
            return  # the client hung up

    async def _stream(self, send: Any, answer: Answer) -> None:
        headers = [(k.encode(), v.encode()) for k, v in answer.headers.items()]
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        piece = answer.raw()
        try:
            for _ in range(answer.chunks):
                if answer.chunk_delay:
                    await asyncio.sleep(answer.chunk_delay)
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except OSError:
            return  # the client hung up, as it should past its cap


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def event_stream(
    *pieces: bytes | tuple[float, bytes], hold: float = 0.0, status: int = 200
) -> Answer:
    """An invented `text/event-stream` answer: `pieces` (bytes, or (delay, bytes)) in
    order, then the stream held open `hold` seconds and closed."""
    timed = [piece if isinstance(piece, tuple) else (0.0, piece) for piece in pieces]
    headers = {"content-type": "text/event-stream", "cache-control": "no-cache"}
    return Answer(status, b"", headers=headers, pieces=timed, hold=hold)


def rewrite_json(change: Callable[[Any], Any]) -> Action:
    """An action that decodes the relay's JSON answer, changes it and sends it on."""

    def action(exchange: Exchange) -> Answer:
        value = exchange.json()
        changed = change(value)
        return Answer(exchange.status, value if changed is None else changed)

    return action
