"""What the proxy passes between the page and the relay (docs/web-vault.md "The proxy"):
pure decisions, so the rules are tested without a server.

The page's Authorization header is forwarded as it came; the proxy never adds a key of its own
(it has none: it reads only the relay's URL from the vault's config). Cookies, the page's
Origin and Referer and hop-by-hop headers are never forwarded. Bodies are passed through and
never logged."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final
from urllib.parse import quote, urlsplit

#: Request headers passed to the relay (lowercase); every other header stays here.
REQUEST_HEADERS: Final = frozenset(
    {"authorization", "content-type", "accept", "x-engram-device", "last-event-id"}
)
#: Response headers passed back to the page (the security headers are the server's own).
RESPONSE_HEADERS: Final = frozenset({"content-type", "retry-after"})
#: The relay's routes the proxy serves: the device routes of PROTOCOL §5, §9-§19.
PREFIX: Final = "/v1/"


def forwarded(headers: Iterable[tuple[str, str]], allowed: frozenset[str]) -> list[tuple[str, str]]:
    """The (name, value) pairs of `headers` whose lowercase name is in `allowed`."""
    return [(name.lower(), value) for name, value in headers if name.lower() in allowed]


def relay_base(server_url: str) -> str:
    """The relay's base URL without a trailing slash; ValueError unless http(s) with a host."""
    parts = urlsplit(server_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"the vault's relay URL {server_url[:200]!r} is not an http(s) URL")
    return server_url.rstrip("/")


def upstream_url(base: str, path: str, query: str) -> str:
    """The relay URL for a proxied `/v1/...` path (re-quoted: no `..` or host can escape)."""
    if not path.startswith(PREFIX):
        raise ValueError("only /v1/ paths are proxied")
    segments = path.split("/")
    if any(segment in (".", "..") for segment in segments):
        raise ValueError("dot segments are not proxied")
    safe = "/".join(quote(segment, safe="@:+$,;=-._~!*'()") for segment in segments)
    return f"{base}{safe}" + (f"?{query}" if query else "")
