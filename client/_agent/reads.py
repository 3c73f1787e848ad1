"""The agent answering `list` and `search` itself (docs/agent.md "Read commands").

The `engram-sync` fast path (client._cli.fast) sends a `read` request; the agent runs the
CLI's own rendering code for it (client._render: list_items/render_list,
search_items/render_search) on a vault it keeps open with the keys it holds, over
consoles built like the CLI's (client._render.console) but writing into
buffers that stand for the command's stdout and stderr: a terminal or not, their encodings,
the terminal size and the environment variables rich reads, all as the command sees them.
The reply carries the bytes and the exit status; any failure answers "not answered" and
the command runs the normal CLI, which then prints the same output or the error.

One thread does every read and owns the open vaults (a SQLite connection stays in its
thread), so the agent's main loop keeps answering `get` at once while a read runs. An open
vault is dropped when its keys are forgotten or replaced, when the agent stops, and when
its database file is no longer the one that was opened (another inode: replaced or
removed). Committed changes of other processes are seen by the next read: the connection
holds no transaction between reads. Nothing here logs or writes memory text anywhere.
"""

from __future__ import annotations

import contextlib
import io
import os
import queue
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from .messages import (
    MAX_OUTPUT,
    STDERR,
    STDOUT,
    HeldKeys,
    ProtocolError,
    Read,
    Reply,
    Terminal,
    send,
)

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer
    from rich.console import Console

    from .._session import VaultSession

SEND_TIMEOUT_S: Final = 10.0  # a command that stops reading its reply is dropped
STOP_JOIN_S: Final = 5.0
NOT_ANSWERED: Final = "not answered"
DB_FILE: Final = "engrams.db"


class _Stream(io.BytesIO):
    """One of the command's output streams: bytes appended, in write order across both
    streams, to the shared chunk list; `isatty` as the command's stream."""

    def __init__(self, number: int, isatty: bool, chunks: list[tuple[int, bytearray]]) -> None:
        super().__init__()
        self._number = number
        self._isatty = isatty
        self._chunks = chunks

    def isatty(self) -> bool:
        return self._isatty

    def write(self, data: ReadableBuffer, /) -> int:
        raw = bytes(data)
        if self._chunks and self._chunks[-1][0] == self._number:
            self._chunks[-1][1].extend(raw)
        else:
            self._chunks.append((self._number, bytearray(raw)))
        return len(raw)


def console_size(
    console: Console, environ: dict[str, str], size: tuple[int, int] | None
) -> tuple[int, int]:
    """rich's `Console.size` (rich 15, POSIX) for a console built with `environ`, with
    `size` as what the command's fds 0, 1, 2 report (os.get_terminal_size) in place of the
    agent's own, which are /dev/null."""
    columns, lines = environ.get("COLUMNS", ""), environ.get("LINES", "")
    width = int(columns) if columns.isdigit() else None
    height = int(lines) if lines.isdigit() else None
    if width is not None and height is not None:
        return width, height
    if console.is_dumb_terminal:
        return 80, 25
    found_width, found_height = size if size is not None else (None, None)
    # COLUMNS and LINES win as they are (even 0); a size from the fds falls back to 80x25
    return (
        width if width is not None else found_width or 80,
        height if height is not None else found_height or 25,
    )


def _console(
    number: int, terminal: Terminal, chunks: list[tuple[int, bytearray]]
) -> tuple[Console, io.TextIOWrapper]:
    from .._render import console

    is_out = number == STDOUT
    stream = io.TextIOWrapper(
        _Stream(number, terminal.stdout_isatty if is_out else terminal.stderr_isatty, chunks),
        encoding=terminal.stdout_encoding if is_out else terminal.stderr_encoding,
        errors=terminal.stdout_errors if is_out else terminal.stderr_errors,
        write_through=True,
    )
    environ = dict(terminal.environ)
    made = console(stderr=not is_out, file=stream, environ=environ)
    made.size = console_size(made, environ, terminal.size)
    return made, stream


def render(session: VaultSession, request: Read) -> list[tuple[int, bytes]]:
    """The command's output, (STDOUT or STDERR, bytes) in write order: the CLI's own code
    for `list` or `search`. Raises what the CLI would raise (the command then runs it)."""
    from .. import _render as rendering
    from .._vault.search import DEFAULT_LIMIT

    chunks: list[tuple[int, bytearray]] = []
    out, out_stream = _console(STDOUT, request.terminal, chunks)
    err, err_stream = _console(STDERR, request.terminal, chunks)
    conn = session.vault.conn
    if request.command == "list":
        rendering.render_list(rendering.list_items(conn), request.json_out, out, err)
    else:
        rendering.check_search(request.query, request.layer)
        limit = DEFAULT_LIMIT if request.limit is None else request.limit
        mode, items = rendering.search_items(
            conn, request.query, list(request.tags), request.project, request.layer, limit
        )
        rendering.render_search(request.query, mode, items, request.json_out, out, err)
    out_stream.flush()
    err_stream.flush()
    return [(number, bytes(data)) for number, data in chunks]


@dataclass
class _OpenVault:
    session: VaultSession
    file_id: tuple[int, int]  # st_dev, st_ino of engrams.db when opened
    keys: HeldKeys


def _file_id(vault: str) -> tuple[int, int] | None:
    try:
        info = os.stat(Path(vault) / DB_FILE)
    except OSError:
        return None
    return info.st_dev, info.st_ino


class OpenVaults:
    """The vaults kept open, by name; used by the read thread only."""

    def __init__(self) -> None:
        self._open: dict[str, _OpenVault] = {}

    def session(self, vault: str, keys: HeldKeys) -> VaultSession | None:
        """The open session of `vault` for `keys`, opened now if needed; None when the
        keys do not open it or it is gone."""
        from .._session import VaultSession
        from .unlocked import sync_keys_of

        file_id = _file_id(vault)
        held = self._open.get(vault)
        if held is not None and held.file_id == file_id and held.keys == keys:
            return held.session
        self.close(vault)
        if file_id is None:
            return None
        session = VaultSession.open_with_keys(Path(vault), keys.db_key, sync_keys_of(keys))
        if session is None:
            return None
        self._open[vault] = _OpenVault(session, file_id, keys)
        return session

    def close(self, vault: str) -> None:
        held = self._open.pop(vault, None)
        if held is not None:
            with contextlib.suppress(Exception):
                held.session.close()

    def close_all(self) -> None:
        for vault in list(self._open):
            self.close(vault)

    def names(self) -> list[str]:
        return sorted(self._open)


@dataclass(frozen=True)
class _ReadJob:
    conn: socket.socket
    request: Read
    keys: HeldKeys


@dataclass(frozen=True)
class _WarmJob:
    vault: str
    keys: HeldKeys


@dataclass(frozen=True)
class _CloseJob:
    vault: str


_Job = _ReadJob | _WarmJob | _CloseJob | None  # None: stop


def answer(vaults: OpenVaults, request: Read, keys: HeldKeys) -> list[tuple[int, bytes]] | None:
    """The output of `request`, or None when the agent leaves it to the command."""
    try:
        session = vaults.session(request.vault, keys)
        if session is None:
            return None
        output = render(session, request)
    except Exception:  # the CLI reports it, in its own words (and without memory text here)
        return None
    if sum(len(data) for _, data in output) > MAX_OUTPUT:
        return None
    return output


def send_output(conn: socket.socket, output: list[tuple[int, bytes]] | None) -> None:
    """The read reply, then the output's bytes raw (docs/agent.md "Read commands")."""
    if output is None:
        send(conn, Reply(ok=False, error=NOT_ANSWERED))
        return
    send(conn, Reply(ok=True, exit_code=0, chunks=[(n, len(data)) for n, data in output]))
    for _, data in output:
        conn.sendall(data)


class ReadWorker:
    """The thread that answers reads and owns the open vaults."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.vaults = OpenVaults()
        self._thread = threading.Thread(target=self._run, name="engram-agent-reads", daemon=True)
        self._thread.start()

    def read(self, conn: socket.socket, request: Read, keys: HeldKeys) -> None:
        """Answer `request` on `conn` (this worker closes it)."""
        self._jobs.put(_ReadJob(conn, request, keys))

    def warm(self, vault: str, keys: HeldKeys) -> None:
        """Import the CLI's read code and open `vault`, so the first read is fast."""
        self._jobs.put(_WarmJob(vault, keys))

    def close(self, vault: str) -> None:
        self._jobs.put(_CloseJob(vault))

    def stop(self) -> None:
        """Close every vault and end the thread (waits a bounded time)."""
        self._jobs.put(None)
        self._thread.join(STOP_JOIN_S)

    def _run(self) -> None:
        try:
            while (job := self._jobs.get()) is not None:
                with contextlib.suppress(Exception):  # one failed job never ends the thread
                    self._do(job)
        finally:
            self.vaults.close_all()

    def _do(self, job: _ReadJob | _WarmJob | _CloseJob) -> None:
        if isinstance(job, _CloseJob):
            self.vaults.close(job.vault)
        elif isinstance(job, _WarmJob):
            with contextlib.suppress(Exception):
                from .. import _render  # noqa: F401 - warm-up

                self.vaults.session(job.vault, job.keys)
        else:
            with job.conn:
                job.conn.settimeout(SEND_TIMEOUT_S)
                output = answer(self.vaults, job.request, job.keys)
                with contextlib.suppress(OSError, ProtocolError):
                    send_output(job.conn, output)
