"""The relay under test, in its own process (honest RSS and CPU figures).

The child side (`python -m bench.relay_child`) builds `create_app(RelayConfig)`
with the production defaults and serves it with uvicorn like `engram-relay serve`
does; the parent side (`RelayProcess`) starts it on a free loopback port, waits
for `/ready` and stops it with SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Final

import httpx
import psutil

from bench.relay_child import ENV_DATABASE_URL, ENV_KEY, ENV_PORT, ENV_WORKERS, serve

ROOT: Final = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def listening_workers(pid: int, port: int) -> list[psutil.Process]:
    """The processes under `pid` listening on `port` (each relay worker opens its own
    socket, some time after the first one already answers)."""
    listening = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a child may exit meanwhile
            conns = child.net_connections("tcp")
            if any(c.status == "LISTEN" and c.laddr.port == port for c in conns):
                listening.append(child)
    return listening


class RelayProcess:
    """Parent side: one relay subprocess on a free loopback port."""

    def __init__(
        self,
        database_url: str,
        key: str,
        log_path: Path,
        workers: int = 1,
        child: tuple[str, ...] = ("-m", "bench.relay_child"),
    ) -> None:
        self.database_url = database_url
        self.child = child  # the child's arguments to python: one that ends in `serve()`
        self.key = key
        self.log_path = log_path
        self.workers = workers
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The relay's process id."""
        if self._proc is None:
            raise RuntimeError("the relay is not running")
        return self._proc.pid

    def start(self, timeout: float = 60.0) -> RelayProcess:
        """Start the relay and wait until `/ready` answers 200."""
        env = dict(os.environ)
        env.update({ENV_DATABASE_URL: self.database_url, ENV_PORT: str(self.port)})
        env[ENV_KEY] = self.key
        env[ENV_WORKERS] = str(self.workers)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(  # noqa: S603 - our own modules
                [sys.executable, *self.child],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, timeout=2.0) as client:
            while True:
                if self._proc.poll() is not None:
                    raise RuntimeError(f"the relay exited at start:\n{self.log_tail()}")
                try:
                    if client.get("/ready").status_code == 200 and self._all_listening():
                        return self
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the relay did not become ready:\n{self.log_tail()}")
                time.sleep(0.05)

    def _all_listening(self) -> bool:
        """Every worker listens: a run must not start while one is still starting, or
        the first connections all land on the others and stay there."""
        if self.workers <= 1 or self._proc is None:
            return True
        return len(listening_workers(self._proc.pid, self.port)) >= self.workers

    def log_tail(self, lines: int = 30) -> str:
        """The end of the relay's output."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM (graceful, like a service manager), then kill after 30 s."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def __enter__(self) -> RelayProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def scratch_relay(key: str) -> Iterator[RelayProcess]:
    """A relay process on a new scratch database, serving `key`; both gone after."""
    from bench.database import BenchDatabase  # the parent's side only

    with (
        BenchDatabase() as db,
        tempfile.TemporaryDirectory() as tmp,
        RelayProcess(db.url, key, Path(tmp) / "relay.log") as relay,
    ):
        yield relay


__all__ = ["ROOT", "RelayProcess", "free_port", "listening_workers", "scratch_relay", "serve"]
