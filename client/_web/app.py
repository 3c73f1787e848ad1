"""The ASGI app of `engram-sync web` (Starlette): the bundle from the installed package as
shared_format.web_bundle serves it (the files of its manifest, index.html with SRI: the same
bytes and policy as the relay's /vault/, docs/web-vault.md "The manifest"), the
page's settings at /engram-web.json (the linked vault id: public, never a key), and `/v1/*`
proxied to the linked relay with httpx, streamed both ways for the live feed (PROTOCOL §15).
Access logs are off and bodies are never logged."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engram_sync.shared_format.web_bundle import (
    INDEX,
    BundleCache,
    content_security_policy,
    content_type,
)

from .forwarding import REQUEST_HEADERS, RESPONSE_HEADERS, forwarded, relay_base, upstream_url
from .headers import ALLOWED_HOSTS, SECURITY_HEADERS

#: A held pull waits up to 60 s (PROTOCOL §15); the event stream has no read timeout.
_TIMEOUT: Final = httpx.Timeout(10.0, read=None)
#: Above the relay's own body limit: the relay answers 413 in its words, not us.
MAX_BODY_BYTES: Final = 64 * 1024 * 1024


class SecurityHeaders:
    """Adds headers.SECURITY_HEADERS and the bundle's CSP to every answer (static files,
    proxy, errors)."""

    def __init__(self, app: ASGIApp, cache: BundleCache) -> None:
        self.app = app
        self.cache = cache

    def policy(self) -> str:
        try:
            return self.cache.current().content_security_policy
        except (OSError, ValueError):  # no page to allow an import map for
            return content_security_policy(None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                ours = [*SECURITY_HEADERS_RAW, (b"content-security-policy", self.policy().encode())]
                names = {name for name, _ in ours}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message["headers"] = kept + ours
            await send(message)

        await self.app(scope, receive, with_headers)


SECURITY_HEADERS_RAW: Final = tuple((k.encode(), v.encode()) for k, v in SECURITY_HEADERS)


def _static(cache: BundleCache) -> Callable[[Request], Awaitable[Response]]:
    """The bundle's files as served (index.html at /), the manifest's and no other."""

    async def static(request: Request) -> Response:
        name = request.path_params["name"] or INDEX
        try:
            files = cache.current().files
        except (OSError, ValueError) as exc:
            return JSONResponse({"error": str(exc), "code": "no_bundle"}, status_code=404)
        if name not in files:
            return JSONResponse({"error": "no such file", "code": "not_found"}, status_code=404)
        return Response(files[name], media_type=content_type(name))

    return static


# long: the proxy, its routes and the lifespan share the one httpx client built here
def build_app(bundle: Path, relay_url: str, vault_id: str | None) -> Starlette:
    """The app; ValueError when `relay_url` is not an http(s) URL (forwarding.relay_base)."""
    relay_url = relay_base(relay_url)
    client = httpx.AsyncClient(timeout=_TIMEOUT, follow_redirects=False, trust_env=False)
    cache = BundleCache(bundle)

    async def settings(_: Request) -> Response:
        return JSONResponse({"vault_id": vault_id})

    async def proxy(request: Request) -> Response:
        try:
            raw_path = request.scope.get("raw_path") or request.url.path.encode()
            url = upstream_url(relay_url, raw_path.decode("latin-1"), request.url.query)
        except ValueError as exc:
            return JSONResponse({"error": str(exc), "code": "not_proxied"}, status_code=400)
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            return JSONResponse(
                {"error": "request body too large for the proxy", "code": "too_large"},
                status_code=413,
            )
        headers = forwarded(request.headers.items(), REQUEST_HEADERS)
        # Bytes are passed on decoded (aiter_bytes): a relay behind a compressing proxy
        # answers gzip, and the page gets no Content-Encoding from us. Identity is asked for.
        headers.append(("accept-encoding", "identity"))
        upstream = client.build_request(request.method, url, headers=headers, content=body)
        try:
            answer = await client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            return JSONResponse(
                {
                    "error": f"the relay at {relay_url} did not answer: {type(exc).__name__}",
                    "code": "relay_unreachable",
                },
                status_code=502,
            )
        return StreamingResponse(
            answer.aiter_bytes(),
            status_code=answer.status_code,
            headers=dict(forwarded(answer.headers.items(), RESPONSE_HEADERS)),
            background=BackgroundTask(answer.aclose),
        )

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    methods = ["GET", "POST", "PUT", "DELETE"]
    return Starlette(
        routes=[
            Route("/engram-web.json", settings),
            Route("/v1/{rest:path}", proxy, methods=methods),
            Route("/account/{rest:path}", proxy, methods=methods),  # PROTOCOL §13
            Route("/auth/{rest:path}", proxy, methods=["POST"]),  # forwarding.AUTH_PATHS
            Route("/{name:path}", _static(cache)),
        ],
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=list(ALLOWED_HOSTS)),
            Middleware(SecurityHeaders, cache=cache),
        ],
        lifespan=lifespan,
    )
