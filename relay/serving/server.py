"""Serving the relay app with uvicorn: one process, or several worker processes.

With `workers > 1`, uvicorn's own supervisor (`uvicorn.supervisors.Multiprocess`)
starts the workers, restarts one that dies and stops them all on SIGINT/SIGTERM. A
worker is a new interpreter (spawned), so it builds its app from the environment the
parent leaves it (`app_from_env`): the relay is stateless, so workers share nothing but
the database (deploy/SCALING.md).

On Linux each worker listens on a socket of its own, bound to the same address with
SO_REUSEPORT, and the kernel spreads new connections over the workers' accept queues.
With one shared socket, the worker that wakes first accepts a whole burst of
connections (an event loop accepts all that are waiting), and keep-alive clients then
stay on that one worker while the others idle (measured: 32 devices connecting at once
all landed on one of two workers, and the relay ran at one core's worth of throughput).
"""

from __future__ import annotations

import errno
import gc
import os
import signal
import socket
import sys
from typing import Final

import uvicorn
from litestar import Litestar

from engram_sync.relay.services.config import RelayConfig, config_from_env
from engram_sync.relay.serving.app import create_app
from engram_sync.relay.serving.connections import (
    ConnectionLimits,
    GuardedConfig,
    ensure_fd_limit,
    limits_from_env,
)
from engram_sync.relay.serving.logs import configure_logging
from engram_sync.relay.serving.worker_metrics import WorkerSupervisor, shared_metrics_dir

APP_FACTORY: Final = "engram_sync.relay.serving.server:app_from_env"
ENV_DATABASE_URL: Final = "ENGRAM_RELAY_DATABASE_URL"
ENV_LOG_LEVEL: Final = "ENGRAM_RELAY_LOG_LEVEL"
ENV_LOG_FORMAT: Final = "ENGRAM_RELAY_LOG_FORMAT"
# Seconds an idle keep-alive connection stays open (uvicorn's default, made explicit): the
# client drops its idle connections sooner (client._http.relay_client.KEEPALIVE_EXPIRY_S), so
# it never sends a request on a connection the relay is closing.
KEEP_ALIVE_S: Final = 5


def app_from_env() -> Litestar:
    """A worker's app: the config the parent process left in the environment."""
    configure_logging(os.environ.get(ENV_LOG_LEVEL, "info"), os.environ.get(ENV_LOG_FORMAT, "json"))
    return _settled(create_app(config_from_env(os.environ[ENV_DATABASE_URL])))


def _settled(app: Litestar) -> Litestar:
    """Move everything alive once the app is built (modules, routes, the app) out of the
    garbage collector's reach (`gc.freeze`). Busy, a worker promotes request objects to
    the oldest generation fast enough for a full collection about every second; over
    the ~85,000 startup objects each one paused every request in flight for 40-65 ms
    (measured with gc.callbacks). Frozen, a full collection walks only what requests
    left behind."""
    gc.collect()
    gc.freeze()
    return app


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


class PortInUseError(Exception):
    """The address `serve` was asked to bind is taken (or not this host's)."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(f"cannot listen on {host}:{port}: {reason}")
        self.host = host
        self.port = port
        self.reason = reason


def open_listeners(host: str, port: int, *, workers: int = 1) -> list[socket.socket]:
    """Bind the relay's socket(s) now, before anything else happens at start-up.

    One socket per address `host` resolves to (`localhost` may be both ::1 and
    127.0.0.1), bound but not listening yet (uvicorn calls listen). A taken port
    raises `PortInUseError` here, so `serve` fails before it mints a key or prints
    that it listens. With `workers > 1` on Linux each one is a `_WorkerSocket`, which
    every worker re-binds with SO_REUSEPORT.
    """
    try:
        infos = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise PortInUseError(host, port, f"cannot resolve {host!r} ({exc.strerror})") from None
    addresses: list[tuple[int, tuple[str, int]]] = []
    for family, _, _, _, sockaddr in infos:
        item = (int(family), (str(sockaddr[0]), int(sockaddr[1])))
        if item not in addresses:
            addresses.append(item)
    per_worker = workers > 1 and _PER_WORKER_SOCKETS
    sockets: list[socket.socket] = []
    try:
        for fam, address in addresses:
            try:
                if per_worker:
                    # Probe without SO_REUSEPORT first: another relay's workers hold the
                    # port with it, and a SO_REUSEPORT bind would silently share it.
                    with _bound_socket(fam, address) as probe:
                        address = (address[0], int(probe.getsockname()[1]))
                    sockets.append(_worker_listener_at(fam, address))
                else:
                    sockets.append(_bound_socket(fam, address))
            except OSError as exc:
                reason = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
                raise PortInUseError(host, port, str(reason or exc)) from None
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def serve_app(
    config: RelayConfig,
    *,
    host: str,
    port: int,
    workers: int = 1,
    sockets: list[socket.socket] | None = None,
    limits: ConnectionLimits | None = None,
) -> None:
    """Serve on `sockets` (from `open_listeners(host, port, workers=workers)`; opened here
    when None) until SIGINT/SIGTERM, then return (after in-flight requests drained); the
    sockets are closed on return.

    With `workers > 1` the workers build their config with `app_from_env`; call
    `export_for_workers` first so that it equals `config`. `limits` (default: from the
    environment) are each process's read timeouts and connection cap (relay.serving.connections).
    """
    limits = limits or limits_from_env()
    ensure_fd_limit(limits)  # before the workers start: they inherit it
    if sockets is None:
        sockets = open_listeners(host, port, workers=workers)
    try:
        if workers <= 1:
            app = _settled(create_app(config))
            server = uvicorn.Server(_uvicorn_config(app, host, port, limits=limits))
            _run_until_signalled(server, sockets)
            return
        multi = _uvicorn_config(
            APP_FACTORY, host, port, factory=True, workers=workers, limits=limits
        )
        with shared_metrics_dir() as metrics_dir:  # one /metrics sums every worker
            # handles SIGINT/SIGTERM itself
            WorkerSupervisor(multi, sockets, metrics_dir=metrics_dir).run()
    finally:
        for sock in sockets:
            sock.close()


# Linux balances the connections of one address over SO_REUSEPORT sockets; elsewhere
# (BSD, macOS) the option means something else, and the workers share one socket.
_PER_WORKER_SOCKETS: Final = sys.platform == "linux" and hasattr(socket, "SO_REUSEPORT")


def _bound_socket(
    family: int, address: tuple[str, int], *, reuse_port: bool = False
) -> socket.socket:
    """A TCP socket bound to `address` (SO_REUSEADDR, as uvicorn binds; SO_REUSEPORT too
    when asked), not listening yet."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:  # `::` must not also claim IPv4 (asyncio does the same)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def _reuse_port_socket(family: int, address: tuple[str, int]) -> socket.socket:
    """A TCP socket bound to `address` with SO_REUSEPORT (not listening yet); module-level
    so that a pickled `_WorkerSocket` can name it."""
    return _bound_socket(family, address, reuse_port=True)


class _WorkerSocket(socket.socket):
    """The supervisor's socket: bound (so a taken port fails here, before any worker
    starts) but never listening, so no connection queues on it. uvicorn hands the
    workers' sockets to each spawned worker by pickling them; this one unpickles as a
    new socket of the worker's own, bound to the same address with SO_REUSEPORT."""

    def __reduce__(self) -> tuple[object, tuple[int, tuple[str, int]]]:
        host, port = self.getsockname()[:2]
        return _reuse_port_socket, (int(self.family), (host, port))


def _worker_listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return _worker_listener_at(family, (host, port))


def _worker_listener_at(family: int, address: tuple[str, int]) -> socket.socket:
    bound = _reuse_port_socket(family, address)
    try:
        return _WorkerSocket(family, socket.SOCK_STREAM, fileno=bound.detach())
    except BaseException:
        bound.close()
        raise


def _uvicorn_config(
    app: Litestar | str,
    host: str,
    port: int,
    *,
    limits: ConnectionLimits,
    factory: bool = False,
    workers: int = 1,
) -> uvicorn.Config:
    return (
        GuardedConfig(  # uvicorn's httptools protocol with the guards (relay.serving.connections)
            app,
            limits=limits,
            host=host,
            port=port,
            factory=factory,
            workers=workers,
            log_config=None,
            access_log=False,  # the relay logs its own access lines (relay.access)
            # Off: uvicorn would rewrite the peer address from X-Forwarded-For for any peer in
            # FORWARDED_ALLOW_IPS (default 127.0.0.1). The app reads the header itself, from
            # ENGRAM_RELAY_TRUSTED_PROXIES only (relay.domain.client_address).
            proxy_headers=False,
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=10,
        )
    )


class _Stop(Exception):  # noqa: N818 - control flow, not an error
    """Raised by our signal handler once uvicorn has shut down gracefully."""


def _run_until_signalled(server: uvicorn.Server, sockets: list[socket.socket]) -> None:
    """Run uvicorn; on SIGINT/SIGTERM it drains requests, then re-raises the signal, which
    lands here (instead of killing the process) so the embedded database is stopped too."""

    def stop(signum: int, frame: object) -> None:
        raise _Stop

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=sockets)
    except _Stop:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
