"""client/_web/forwarding.py (docs/web-vault.md "The proxy"): what `engram-sync web` passes to
the relay and back, as pure decisions, and the proxy doing it against a recording upstream."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engram_sync.client._web.app import build_app
from engram_sync.client._web.bundle import bundle_dir
from engram_sync.client._web.forwarding import (
    REQUEST_HEADERS,
    RESPONSE_HEADERS,
    forwarded,
    relay_base,
    upstream_url,
)
from tests.web.conftest import ServedApp


def test_only_the_listed_request_headers_are_forwarded() -> None:
    sent = [
        ("Authorization", "Bearer k"), ("Cookie", "s=1"), ("Origin", "http://127.0.0.1:1"),
        ("Referer", "http://127.0.0.1:1/"), ("Content-Type", "application/json"),
        ("Connection", "keep-alive"), ("Host", "127.0.0.1:1"), ("X-Forwarded-For", "1.2.3.4"),
    ]  # fmt: skip
    assert forwarded(sent, REQUEST_HEADERS) == [
        ("authorization", "Bearer k"),
        ("content-type", "application/json"),
    ]
    answer = [("Set-Cookie", "a=b"), ("Content-Type", "text/event-stream"), ("Retry-After", "2")]
    assert forwarded(answer, RESPONSE_HEADERS) == [
        ("content-type", "text/event-stream"),
        ("retry-after", "2"),
    ]


def test_only_v1_paths_reach_the_relay_and_none_escapes_it() -> None:
    base = relay_base("https://relay.example/")
    assert base == "https://relay.example"
    assert upstream_url(base, "/v1/vaults/v/pull", "cursor=0") == (
        "https://relay.example/v1/vaults/v/pull?cursor=0"
    )
    assert upstream_url(base, "/v1/vaults/a%2Fb/push", "") == (
        "https://relay.example/v1/vaults/a%2Fb/push"  # one segment, as the page encoded it
    )
    assert upstream_url(base, "/v1/@evil.example/x", "").startswith("https://relay.example/")
    # PROTOCOL §13 for the page's account unlock: sign-in, logout and /account/* only
    assert upstream_url(base, "/auth/signin", "") == "https://relay.example/auth/signin"
    assert upstream_url(base, "/account/vaults/v/wrap", "") == (
        "https://relay.example/account/vaults/v/wrap"
    )
    bad = ("/v1/../admin", "/v1/vaults/./x", "/v1/%2e%2e/admin", "/v1/vaults/a b", "/v1/a\\b",
           "/health", "/auth/signup", "/auth/recover", "/account", "/accounts/x",
           "/account/../v1/x", "/v1/x#frag", "/v1/x?y")  # fmt: skip
    for path in bad:
        with pytest.raises(ValueError):
            upstream_url(base, path, "")
    for url in ("file:///etc/passwd", "relay.example", "ftp://relay.example"):
        with pytest.raises(ValueError):
            relay_base(url)


@pytest.fixture(scope="module")
def upstream() -> Iterator[ServedApp]:
    """A relay stand-in answering every /v1/ request with the headers and body it got."""

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "headers": dict(request.headers),
                "body": (await request.body()).decode(),
                "path": request.scope["raw_path"].decode(),
            },
            headers={"set-cookie": "tracker=1", "retry-after": "3"},
        )

    async def gzipped(request: Request) -> Response:
        body = gzip.compress(json.dumps({"asked": request.headers.get("accept-encoding")}).encode())
        return Response(body, headers={"content-encoding": "gzip"}, media_type="application/json")

    app = Starlette(
        routes=[
            Route("/v1/gzip", gzipped),
            Route("/v1/{rest:path}", echo, methods=["GET", "POST"]),
        ]
    )
    with ServedApp(app) as served:
        yield served


def test_the_proxy_forwards_the_page_authorization_and_adds_nothing(upstream: ServedApp) -> None:
    with ServedApp(build_app(bundle_dir(), upstream.url, "v")) as web:
        answer = httpx.post(
            f"{web.url}v1/vaults/team%2Fa/push",
            headers={"Authorization": "Bearer page-key", "Cookie": "s=1", "Origin": web.url},
            content=b'{"blobs":[]}',
            timeout=5,
        )
        keyless = httpx.get(f"{web.url}v1/vaults/v/pull?cursor=0", timeout=5)
        compressed = httpx.get(f"{web.url}v1/gzip", headers={"Accept-Encoding": "identity"})
    assert answer.status_code == 200
    seen = answer.json()
    assert seen["headers"]["authorization"] == "Bearer page-key"
    assert "cookie" not in seen["headers"]
    assert "origin" not in seen["headers"]
    assert seen["body"] == '{"blobs":[]}'
    assert seen["path"] == "/v1/vaults/team%2Fa/push"  # the vault id stays one segment
    assert "set-cookie" not in answer.headers
    assert answer.headers["retry-after"] == "3"
    assert "content-security-policy" in answer.headers
    assert "authorization" not in keyless.json()["headers"]  # no key of the proxy's own
    # a relay behind a compressing proxy: the page gets the JSON itself, no Content-Encoding
    assert "content-encoding" not in compressed.headers
    assert compressed.json() == {"asked": "identity"}
