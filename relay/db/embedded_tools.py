"""Running the embedded server's tools and reading what the server left: a tool run without
pipes (as the system account when we are root; relay.db.embedded_install), `postmaster.pid`,
whether a process is still the one that was recorded, a free loopback port, a log's tail.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engram_sync.relay.db.embedded_install import Account, EmbeddedPostgresError

LOOPBACK_HOST = "127.0.0.1"
_LOG_TAIL_LINES = 25


@dataclass(frozen=True)
class ToolResult:
    """What a tool run left: its exit code and output."""

    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Postmaster:
    """What ``postmaster.pid`` says about a running server."""

    pid: int
    port: int
    listen: str
    status: str


def read_postmaster(data_dir: Path) -> Postmaster | None:
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
    except OSError:
        return None
    if len(lines) < 8:
        return None
    try:
        return Postmaster(
            pid=int(lines[0]), port=int(lines[3]), listen=lines[5].strip(), status=lines[7].strip()
        )
    except ValueError:
        return None


def process_start(pid: int) -> str:
    """The start time of process `pid` (Linux: /proc/PID/stat field 22), or "" if unknown;
    with the pid it names one process, even after the pid is reused."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = text.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""


def process_alive(pid: int, started: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    now = process_start(pid)
    return not (started and now and now != started)  # a reused pid is another process


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def run_tool(
    account: Account | None,
    argv: Sequence[str],
    *,
    cwd: Path,
    timeout: float,
    log_file: Path,
    stdin_text: str | None = None,
    password: str | None = None,
) -> ToolResult:
    """Run a server tool, as ``account`` when given; output goes via temp files.

    Pipes are avoided on purpose: a server started by ``pg_ctl`` could inherit
    them and keep ``communicate()`` waiting. ``stdin_text`` (which may hold the
    password) goes through an unlinked 0600 temp file, ``password`` as ``PGPASSWORD``:
    neither is on the command line. A timeout raises, with the tail of `log_file`.
    """
    kwargs: dict[str, Any] = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_MESSAGES"] = "C"
    env["PGPASSFILE"] = os.devnull  # no ~/.pgpass: what we pass is all there is
    if password is not None:
        env["PGPASSWORD"] = password
    if account is not None:
        kwargs.update(user=account.uid, group=account.gid, extra_groups=[], umask=0o077)
        env.update(HOME=account.home, USER=account.name, LOGNAME=account.name)
    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
        tempfile.TemporaryFile("w+") as stdin,
    ):
        if stdin_text is not None:
            stdin.write(stdin_text)
            stdin.flush()
            stdin.seek(0)
        try:
            proc = subprocess.run(  # noqa: S603 - fixed binaries, no shell
                list(argv),
                stdin=stdin if stdin_text is not None else subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                text=True,
                cwd=cwd,
                env=env,
                timeout=timeout,
                check=False,
                **kwargs,
            )
        except subprocess.TimeoutExpired as exc:
            raise EmbeddedPostgresError(
                f"{Path(argv[0]).name} timed out after {exc.timeout:.0f}s "
                f"(data dir {cwd})\n{tail(log_file)}"
            ) from exc
        out.seek(0)
        err.seek(0)
        return ToolResult(proc.returncode, out.read(), err.read())
