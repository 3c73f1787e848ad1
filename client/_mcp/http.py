"""`engram-sync mcp --http`: the server over Streamable HTTP, on 127.0.0.1 only, each
request with a client's bearer token (docs/mcp.md "HTTP").

The HTTP side is the `mcp` package's own: `MCPServer.streamable_http_app` (its session
manager, its DNS-rebinding check of Host and Origin for a loopback host) behind its
bearer-token hook (`token_verifier` with `AuthSettings`: `BearerAuthBackend`, then
`RequireAuthMiddleware` answering 401 before any tool runs), served by uvicorn. Ours is
the verifier: a token `tokens.TokenStore` knows, read from its file on every request, so a
revoked token is refused at once. Sessions are bound to the token that opened them (the
package compares the principal on every request).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings

from .access import VaultAccess
from .live import LiveLoop
from .server import build_server
from .tokens import TokenStore

LOOPBACK: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8765
PATH: Final = "/mcp"


def check_host(host: str) -> str:
    """`host` when it is 127.0.0.1; ValueError (one line, the reason) for any other."""
    if host != LOOPBACK:
        raise ValueError(
            f"--host {host[:100]}: the MCP HTTP server listens on {LOOPBACK} only (any other"
            " address lets other machines reach the vault's memories)"
        )
    return host


class VaultTokens:
    """The `mcp` package's TokenVerifier over the vault's token file: a known token is an
    AccessToken whose client_id is the token's name."""

    def __init__(self, store: TokenStore) -> None:
        self.store = store

    async def verify_token(self, token: str) -> AccessToken | None:
        name = self.store.name_of(token)
        if name is None:
            return None
        return AccessToken(token="(redacted)", client_id=name, scopes=[])  # noqa: S106


def http_app(access: VaultAccess, live: LiveLoop | None, store: TokenStore, port: int) -> object:
    """The Starlette app serving MCP at /mcp, refusing every request without a valid token."""
    origin = f"http://{LOOPBACK}:{port}"
    server = build_server(
        access,
        live,
        token_verifier=VaultTokens(store),
        auth=AuthSettings(issuer_url=origin, resource_server_url=None),  # type: ignore[arg-type]
    )
    return server.streamable_http_app(streamable_http_path=PATH, host=LOOPBACK)


def run_http(
    vault_dir: Path, passphrase: str | None, *, host: str, port: int, live: bool = True
) -> None:
    """Serve the vault over Streamable HTTP until SIGINT or SIGTERM."""
    import uvicorn  # a dependency of mcp's HTTP side, imported where it serves

    check_host(host)
    store = TokenStore(vault_dir)
    access = VaultAccess(vault_dir, passphrase)
    loop = LiveLoop(vault_dir, passphrase, enabled=live).start()
    try:
        app = http_app(access, loop, store, port)
        print(f"serving MCP at http://{LOOPBACK}:{port}{PATH} (Ctrl-C to stop)", file=sys.stderr)
        config = uvicorn.Config(app, host=LOOPBACK, port=port, log_level="warning")  # type: ignore[arg-type]
        uvicorn.Server(config).run()
    finally:
        loop.stop()
        access.close()
