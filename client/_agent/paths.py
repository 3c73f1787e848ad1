"""Where the agent listens: `<runtime dir>/engram-sync/agent.sock` (docs/agent.md).

The runtime directory is `$XDG_RUNTIME_DIR` when it is set to an absolute directory, else
`/run/user/<uid>` when it exists and is this user's, else `<tmp>/engram-sync-<uid>` (the
stdlib's temporary directory). The socket's own directory is made 0700 and must be owned by
this user and not a symbolic link: a directory another user prepared is refused.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

TYPE_CHECKING = False  # no `typing` at run time (client/__init__.py says why)
if TYPE_CHECKING:
    from typing import Final

APP_DIR: Final = "engram-sync"
SOCKET_NAME: Final = "agent.sock"
LOCK_NAME: Final = "agent.lock"
SOCKET_PATH_MAX_BYTES: Final = 107  # Linux: sun_path holds 108 bytes with the final NUL
DIR_MODE: Final = 0o700


class AgentDirError(OSError):
    """The agent's directory is not safe to use (someone else's, a link, too open)."""


def runtime_dir() -> Path:
    """The user's runtime directory (module docstring)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg):
        return Path(xdg)
    uid = os.getuid()
    run_user = Path(f"/run/user/{uid}")
    try:
        info = run_user.lstat()
        if stat.S_ISDIR(info.st_mode) and info.st_uid == uid:
            return run_user
    except OSError:
        pass
    return _tempdir()


def _tempdir() -> Path:
    import tempfile  # here: the `engram-sync` fast path (client._cli.fast) seldom needs it

    return Path(tempfile.gettempdir())


def _may_be_tempdir(base: Path) -> bool:
    """Whether `base` is one of the directories tempfile.gettempdir() can return (its
    candidates), so that most runs need not import tempfile to compare with it."""
    candidates = [os.environ.get(name) for name in ("TMPDIR", "TEMP", "TMP")]
    candidates += ["/tmp", "/var/tmp", "/usr/tmp"]  # noqa: S108 - tempfile's own list
    with contextlib.suppress(OSError):
        candidates.append(os.getcwd())
    return str(base) in {os.path.abspath(c) for c in candidates if c}


def agent_dir() -> Path:
    """The agent's directory (not created here)."""
    base = runtime_dir()
    if _may_be_tempdir(base) and base == _tempdir():
        return base / f"{APP_DIR}-{os.getuid()}"
    return base / APP_DIR


def socket_path() -> Path:
    """The agent's socket."""
    return agent_dir() / SOCKET_NAME


_WHAT_TO_DO: Final = (
    "remove it (as its owner or root), or set XDG_RUNTIME_DIR to a directory of your own"
)


def agent_dir_problem(directory: Path, info: os.stat_result, uid: int) -> str | None:
    """Why the agent must not use `directory` (its lstat `info`), as one line saying
    what to do; None when it is a directory of user `uid`."""
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        return (
            f"the key agent's directory {directory} is not a directory (a link or a file): "
            f"refusing to use it; {_WHAT_TO_DO}"
        )
    if info.st_uid != uid:
        return (
            f"the key agent's directory {directory} belongs to another user "
            f"(uid {info.st_uid}): refusing to use it; {_WHAT_TO_DO}"
        )
    return None


def socket_path_problem(path: Path) -> str | None:
    """Why a Unix socket cannot be bound at `path` (longer than the kernel takes), as one
    line saying what to do; None when it fits."""
    size = len(os.fsencode(path))
    if size <= SOCKET_PATH_MAX_BYTES:
        return None
    return (
        f"the key agent's socket path {path} is {size} bytes, longer than the "
        f"{SOCKET_PATH_MAX_BYTES} a Unix socket takes: set XDG_RUNTIME_DIR to a shorter "
        "directory of your own"
    )


def ensure_agent_dir() -> Path:
    """Make the agent's directory 0700 (or check the one there) and return it.

    AgentDirError when it exists but is a link, not a directory, or another user's
    (`agent_dir_problem`), or when the socket's path in it is too long to bind
    (`socket_path_problem`: else the agent would die before saying why). `engram-sync
    unlock` calls it before it starts the agent, so the person reads why (issue 31); the
    agent calls it again before it listens.
    """
    directory = agent_dir()
    too_long = socket_path_problem(directory / SOCKET_NAME)
    if too_long is not None:
        raise AgentDirError(too_long)
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=DIR_MODE)
    info = directory.lstat()
    problem = agent_dir_problem(directory, info, os.getuid())
    if problem is not None:
        raise AgentDirError(problem)
    if stat.S_IMODE(info.st_mode) != DIR_MODE:
        os.chmod(directory, DIR_MODE)
    return directory
