"""What the proxy passes between the page and the relay (docs/web-vault.md "The proxy"):
pure decisions, so the rules are tested without a server.

The page's Authorization header is forwarded as it came; the proxy never adds a key of its own
(it has none: it reads only the relay's URL from the vault's config). Cookies, the page's
Origin and Referer and hop-by-hop headers are never forwarded. Bodies are passed through and
never logged."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import unquote, urlsplit

#: Request headers passed to the relay (lowercase); every other header stays here.
REQUEST_HEADERS: Final = frozenset(
    {"authorization", "content-type", "accept", "x-engram-device", "last-event-id"}
)
#: Response headers passed back to the page (the security headers are the server's own).
RESPONSE_HEADERS: Final = frozenset({"content-type", "retry-after"})
#: The relay's routes the proxy serves: the device routes of PROTOCOL §5, §9-§19, and the
#: account routes of §13 the page's account and passkey unlock use (docs/web-vault.md).
PREFIX: Final = "/v1/"
ACCOUNT_PREFIX: Final = "/account/"
AUTH_PATHS: Final = frozenset({"/auth/signin", "/auth/logout"})
#: RFC 3986 path characters (unreserved, sub-delims, ":", "@", "/") and percent-escapes.
_PATH: Final = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2})*")


def forwarded(headers: Iterable[tuple[str, str]], allowed: frozenset[str]) -> list[tuple[str, str]]:
    """The (name, value) pairs of `headers` whose lowercase name is in `allowed`."""
    return [(name.lower(), value) for name, value in headers if name.lower() in allowed]


def relay_base(server_url: str) -> str:
    """The relay's base URL without a trailing slash; ValueError unless http(s) with a host."""
    parts = urlsplit(server_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"the vault's relay URL {server_url[:200]!r} is not an http(s) URL")
    return server_url.rstrip("/")


def upstream_url(base: str, raw_path: str, query: str) -> str:
    """The relay URL for a proxied `/v1/...`, `/account/...` or sign-in path, given as sent
    (still percent-encoded, so a vault id holding `/` stays one segment, as the Python
    client's `quote(id, safe="")` sends it). Dot segments, encoded or not, and characters
    outside a URL path are refused: no path can leave the relay's /v1/ (or /account/) or
    reach another host."""
    if not (raw_path.startswith((PREFIX, ACCOUNT_PREFIX)) or raw_path in AUTH_PATHS):
        raise ValueError("only /v1/, /account/ and sign-in paths are proxied")
    segments = raw_path.split("/")
    if any(unquote(segment) in (".", "..") for segment in segments):
        raise ValueError("dot segments are not proxied")
    if not _PATH.fullmatch(raw_path):
        raise ValueError("the path holds characters a URL path cannot")
    return f"{base}{raw_path}" + (f"?{query}" if query else "")
