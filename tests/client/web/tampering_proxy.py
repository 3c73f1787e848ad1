"""A tampering proxy in front of a relay, for `web verify`'s tests and the CSP/SRI tests in
Chromium: every request is passed on as it came; an answer under /vault/ whose path has a
rule is changed by it on the way back (its bytes, its headers, or a 404)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench.browser import ServedApp

#: (body, headers) -> the new (body, headers), or None for a 404.
Rule = Callable[[bytes, dict[str, str]], tuple[bytes, dict[str, str]] | None]
_DROPPED = frozenset({"content-length", "content-encoding", "transfer-encoding", "connection"})


class TamperingProxy:
    """Serves on 127.0.0.1 (`url`); `rules` maps a path under /vault/ ("" for the page at
    /vault/) to its Rule; tests set and clear them between requests."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.rules: dict[str, Rule] = {}
        self.served = ServedApp(self._app())
        self.url = self.served.url.rstrip("/")

    def _app(self) -> Starlette:
        client = httpx.AsyncClient(timeout=30, follow_redirects=False, trust_env=False)

        async def forward(request: Request) -> Response:
            raw = request.scope.get("raw_path") or request.url.path.encode()
            url = self.upstream + raw.decode("latin-1")
            if request.url.query:
                url += "?" + request.url.query
            headers = [(k, v) for k, v in request.headers.items() if k.lower() != "host"]
            answer = await client.request(
                request.method, url, headers=headers, content=await request.body()
            )
            body = answer.content
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in _DROPPED}
            path = request.url.path
            rule = (
                self.rules.get(path.removeprefix("/vault/")) if path.startswith("/vault/") else None
            )
            if rule is not None:
                changed = rule(body, kept)
                if changed is None:
                    return Response(b'{"code":"not_found"}', status_code=404)
                body, kept = changed
            return Response(body, status_code=answer.status_code, headers=kept)

        methods = ["GET", "POST", "PUT", "DELETE"]
        return Starlette(routes=[Route("/{rest:path}", forward, methods=methods)])

    def __enter__(self) -> TamperingProxy:
        self.served.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.served.__exit__(*exc)
