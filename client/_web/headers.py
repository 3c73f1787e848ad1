"""The headers every answer of `engram-sync web` carries (docs/web-vault.md "Served how").

The page runs nothing it did not load from this origin: no inline script, no eval (WebAssembly
compilation alone is allowed, for hash-wasm's Argon2id), it talks to this origin only (the
relay through the proxy), and no other site may frame it."""

from __future__ import annotations

from typing import Final

CONTENT_SECURITY_POLICY: Final = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self' 'wasm-unsafe-eval'",
        "worker-src 'self'",
        "connect-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)

SECURITY_HEADERS: Final = (
    ("content-security-policy", CONTENT_SECURITY_POLICY),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("cross-origin-opener-policy", "same-origin"),
    ("cache-control", "no-store"),
)

#: Host header values the server answers (a DNS-rebinding page gets 400).
ALLOWED_HOSTS: Final = ("127.0.0.1", "localhost")
