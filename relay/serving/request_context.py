"""A request id per HTTP request, carried into every log line emitted while serving it."""

from __future__ import annotations

import logging
import re
import secrets
from contextvars import ContextVar
from typing import Final

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

HEADER: Final = b"x-request-id"
_SAFE_ID: Final = re.compile(rb"[A-Za-z0-9._-]{1,64}")
request_id_var: ContextVar[str | None] = ContextVar("engram_request_id", default=None)


class RequestIdFilter(logging.Filter):
    """Adds `request_id` (or None) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


def request_id_middleware(app: ASGIApp) -> ASGIApp:
    """Take a sane incoming `X-Request-ID` or make one; echo it on the response."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        incoming = dict(scope["headers"]).get(HEADER, b"")
        request_id = incoming.decode() if _SAFE_ID.fullmatch(incoming) else secrets.token_hex(8)
        token = request_id_var.set(request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((HEADER, request_id.encode()))
                message["headers"] = headers
            await send(message)

        try:
            await app(scope, receive, send_with_id)
        finally:
            request_id_var.reset(token)

    return middleware
