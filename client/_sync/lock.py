"""One sync of a vault directory at a time (issue 13): `watch` and a manual `sync`, or two
programs using the library, must not interleave their writes of `device.json` and
`sync_state.json`, nor reserve the same clock values.

An exclusive `flock` on `.sync.lock` in the vault directory, held for the whole sync. The
kernel drops it when the process dies, so a crash never leaves a stale lock. A second
sync waits briefly, then says another one is running.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from .._errors import SyncError

LOCK_FILE: Final = ".sync.lock"
DEFAULT_WAIT_SECS: Final = 10.0
POLL_SECS: Final = 0.05
PID_WIDTH: Final = 20  # digits of the pid written in the lock file (a 64-bit pid fits)


class SyncBusyError(SyncError):
    """Another sync of the same vault directory holds the lock."""


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return f" (process {text})" if text.isdigit() else ""


@contextmanager
def sync_lock(vault_dir: Path, *, wait: float = DEFAULT_WAIT_SECS) -> Iterator[None]:
    """Hold the vault's sync lock; SyncBusyError when another holder keeps it `wait` s."""
    fd = os.open(vault_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise SyncBusyError(
                        f"another sync of the vault at {vault_dir} is running{_holder(fd)}; "
                        "it was waited for "
                        f"{wait:g} s: let it finish (or stop `engram-sync watch`) and run "
                        "this again"
                    ) from None
                time.sleep(POLL_SECS)
        # the holder's pid in a fixed width over whatever was there, without a truncate:
        # ftruncate is a metadata change the file system journals (1-3 ms of every sync,
        # issue 36); `_holder` strips the padding
        os.pwrite(fd, f"{os.getpid():>{PID_WIDTH}}\n".encode("ascii"), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
