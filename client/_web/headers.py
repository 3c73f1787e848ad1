"""The headers every answer of `engram-sync web` carries (docs/web-vault.md "Served how").

The page runs nothing it did not load from this origin: no inline script but its import map
(allowed by its hash), no eval (WebAssembly compilation alone is allowed, for hash-wasm's
Argon2id), it talks to this origin only (the relay through the proxy), and no other site may
frame it. The Content-Security-Policy is the bundle's (shared_format.web_bundle), the same the
relay sends at /vault/; the others are here."""

from __future__ import annotations

from typing import Final

SECURITY_HEADERS: Final = (
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("cross-origin-opener-policy", "same-origin"),
    ("cache-control", "no-store"),
)

#: Host header values the server answers (a DNS-rebinding page gets 400).
ALLOWED_HOSTS: Final = ("127.0.0.1", "localhost")
