"""The agent process: keys per vault in memory, one request per connection, only for its
own uid, until an idle timeout or `stop` (docs/agent.md).

Idle means no `put` and no `get` that returned keys: a command that uses the agent keeps it
alive, a refused or unknown peer does not. Nothing here logs or writes a key anywhere; the
process's stdout says only `ready` or `running` to the `unlock` that started it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Final

from .messages import (
    Forget,
    Get,
    HeldKeys,
    ProtocolError,
    Put,
    Read,
    Reply,
    Request,
    Status,
    Stop,
    read_request,
    send,
)
from .paths import LOCK_NAME, SOCKET_NAME, ensure_agent_dir
from .peer import peer_allowed

if TYPE_CHECKING:
    from .reads import ReadWorker

DEFAULT_IDLE_TIMEOUT_S: Final = 15 * 60.0
CONNECTION_TIMEOUT_S: Final = 2.0  # a peer that stalls mid-message is dropped, never waited on
BACKLOG: Final = 16
REFUSED: Final = "refused: the agent answers only its own user"
LOCKED: Final = "locked"


class _StopSignalError(Exception):
    """SIGTERM or SIGINT: leave the loop, remove the socket."""


class Agent:
    """The keys held per vault and the idle clock."""

    def __init__(self, idle_timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._held: dict[str, HeldKeys] = {}
        self._idle_timeout_s = idle_timeout_s
        self._clock = clock
        self._last_used = clock()
        self._reads: ReadWorker | None = None  # started by the first put (client._agent.reads)

    def idle_left(self) -> float:
        """Seconds until the idle timeout."""
        return self._last_used + self._idle_timeout_s - self._clock()

    def answer(self, request: Request) -> tuple[Reply, bool]:
        """The reply to `request` and whether the agent stops after sending it."""
        if isinstance(request, Put):
            if self._held.get(request.vault) != request.keys and self._reads is not None:
                self._reads.close(request.vault)  # opened with other keys
            self._held[request.vault] = request.keys
            self._idle_timeout_s = request.idle_timeout_s
            self._last_used = self._clock()
            return Reply(ok=True, vaults=sorted(self._held)), False
        if isinstance(request, Get):
            keys = self._held.get(request.vault)
            if keys is None:
                return Reply(ok=False, error=LOCKED), False
            self._last_used = self._clock()
            return Reply(ok=True, keys=keys), False
        if isinstance(request, Forget):
            found = self._held.pop(request.vault, None) is not None
            if self._reads is not None:
                self._reads.close(request.vault)
            return Reply(
                ok=found, error=None if found else LOCKED, vaults=sorted(self._held)
            ), False
        if isinstance(request, Stop):
            self.forget_all()
            return Reply(ok=True), True
        if isinstance(request, Read):  # serve_one hands a held vault's read to the worker
            return Reply(ok=False, error=LOCKED), False
        assert isinstance(request, Status)
        return (
            Reply(
                ok=True,
                vaults=sorted(self._held),
                idle_timeout_s=self._idle_timeout_s,
                idle_left_s=max(0.0, self.idle_left()),
                pid=os.getpid(),
            ),
            False,
        )

    def serve_one(self, conn: socket.socket) -> bool:
        """Answer one connection; True when the agent should stop."""
        conn.settimeout(CONNECTION_TIMEOUT_S)
        if not peer_allowed(conn):
            with contextlib.suppress(OSError):
                send(conn, Reply(ok=False, error=REFUSED))
            return False
        try:
            request = read_request(conn)
        except (ProtocolError, OSError):
            return False
        if isinstance(request, Read) and request.vault in self._held:
            self._last_used = self._clock()  # a command served from the keys
            self._worker().read(conn.dup(), request, self._held[request.vault])
            return False
        reply, stop = self.answer(request)
        with contextlib.suppress(OSError):
            send(conn, reply)
        if isinstance(request, Put) and reply.ok:
            self._worker().warm(request.vault, request.keys)
        return stop

    def _worker(self) -> ReadWorker:
        """The read thread (docs/agent.md "Read commands"), started on first use."""
        if self._reads is None:
            from .reads import ReadWorker

            self._reads = ReadWorker()
        return self._reads

    def serve(self, listener: socket.socket) -> None:
        """Accept until the idle timeout or a `stop`."""
        while True:
            left = self.idle_left()
            if left <= 0:
                return
            listener.settimeout(left)
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                if self.serve_one(conn):
                    return

    def forget_all(self) -> None:
        """Drop every key and close every vault the read thread holds open."""
        self._held.clear()
        if self._reads is not None:
            self._reads.stop()
            self._reads = None


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise _StopSignalError


def _bind(path: Path) -> socket.socket:
    """A listening socket at `path`, 0600 from the start (umask) and after (chmod)."""
    path.unlink(missing_ok=True)  # a dead agent's socket: the lock says none is alive
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(str(path))
    except BaseException:
        listener.close()
        raise
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    listener.listen(BACKLOG)
    return listener


def run(idle_timeout_s: float, report: Callable[[str], None]) -> int:
    """Run the agent until it stops; `report` gets `ready` or `running` (another agent
    holds the lock). Returns the exit status."""
    directory = ensure_agent_dir()
    lock_fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report("running")
            return 0
        path = directory / SOCKET_NAME
        listener = _bind(path)
        bound = path.stat().st_ino
        agent = Agent(idle_timeout_s)
        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            report("ready")
            agent.serve(listener)
        except _StopSignalError:
            pass
        finally:
            agent.forget_all()
            listener.close()
            with contextlib.suppress(OSError):
                if path.stat().st_ino == bound:
                    path.unlink()
        return 0
    finally:
        os.close(lock_fd)
