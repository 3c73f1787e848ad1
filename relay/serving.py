"""Serving the relay app with uvicorn: one process, or several worker processes.

With `workers > 1`, uvicorn's own supervisor (`uvicorn.supervisors.Multiprocess`)
binds the socket once, starts the workers, restarts one that dies and stops them all
on SIGINT/SIGTERM. A worker is a new interpreter (spawned), so it builds its app from
the environment the parent leaves it (`app_from_env`): the relay is stateless, so
workers share nothing but the database (deploy/SCALING.md).
"""

from __future__ import annotations

import os
import signal
from typing import Final

import uvicorn
from litestar import Litestar
from uvicorn.supervisors import Multiprocess

from relay.app import create_app
from relay.config import RelayConfig, config_from_env
from relay.logs import configure_logging

APP_FACTORY: Final = "relay.serving:app_from_env"
ENV_DATABASE_URL: Final = "ENGRAM_RELAY_DATABASE_URL"
ENV_LOG_LEVEL: Final = "ENGRAM_RELAY_LOG_LEVEL"
ENV_LOG_FORMAT: Final = "ENGRAM_RELAY_LOG_FORMAT"


def app_from_env() -> Litestar:
    """A worker's app: the config the parent process left in the environment."""
    configure_logging(os.environ.get(ENV_LOG_LEVEL, "info"), os.environ.get(ENV_LOG_FORMAT, "json"))
    return create_app(config_from_env(os.environ[ENV_DATABASE_URL]))


def export_for_workers(
    database_url: str, overrides: dict[str, int | None], log_level: str, log_format: str
) -> None:
    """Leave what `app_from_env` needs in the environment the workers inherit."""
    os.environ[ENV_DATABASE_URL] = database_url
    os.environ[ENV_LOG_LEVEL] = log_level
    os.environ[ENV_LOG_FORMAT] = log_format
    for name, value in overrides.items():
        if value is not None:
            os.environ[f"ENGRAM_RELAY_{name.upper()}"] = str(value)


def serve_app(config: RelayConfig, *, host: str, port: int, workers: int = 1) -> None:
    """Serve until SIGINT/SIGTERM, then return (after in-flight requests drained).

    With `workers > 1` the workers build their config with `app_from_env`; call
    `export_for_workers` first so that it equals `config`.
    """
    if workers <= 1:
        _run_until_signalled(uvicorn.Server(_uvicorn_config(create_app(config), host, port)))
        return
    multi = _uvicorn_config(APP_FACTORY, host, port, factory=True, workers=workers)
    socket = multi.bind_socket()
    try:
        Multiprocess(multi, sockets=[socket]).run()  # handles SIGINT/SIGTERM itself
    finally:
        socket.close()


def _uvicorn_config(
    app: Litestar | str, host: str, port: int, *, factory: bool = False, workers: int = 1
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        factory=factory,
        workers=workers,
        log_config=None,
        access_log=False,  # the relay logs its own access lines (relay.access)
        timeout_graceful_shutdown=10,
    )


class _Stop(Exception):  # noqa: N818 - control flow, not an error
    """Raised by our signal handler once uvicorn has shut down gracefully."""


def _run_until_signalled(server: uvicorn.Server) -> None:
    """Run uvicorn; on SIGINT/SIGTERM it drains requests, then re-raises the signal, which
    lands here (instead of killing the process) so the embedded database is stopped too."""

    def stop(signum: int, frame: object) -> None:
        raise _Stop

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    except _Stop:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
