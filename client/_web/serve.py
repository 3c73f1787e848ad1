"""Running the app with uvicorn on 127.0.0.1 (a free port unless one is asked for), printing
the URL and opening it in the browser unless told not to."""

from __future__ import annotations

import socket
import webbrowser
from collections.abc import Callable
from typing import Final

import uvicorn

from .app import build_app
from .bundle import bundle_dir

LOOPBACK: Final = "127.0.0.1"


def listening_socket(port: int) -> socket.socket:
    """A socket bound to 127.0.0.1:`port` (0: a free port the system picks)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, port))
    sock.listen(128)
    return sock


def run(
    relay_url: str,
    vault_id: str | None,
    *,
    port: int = 0,
    open_browser: bool = True,
    announce: Callable[[str], None] = print,
) -> None:
    """Serve until SIGINT or SIGTERM."""
    app = build_app(bundle_dir(), relay_url, vault_id)
    sock = listening_socket(port)
    url = f"http://{LOOPBACK}:{sock.getsockname()[1]}/"
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    announce(url)
    if open_browser:
        webbrowser.open(url)
    server.run(sockets=[sock])
