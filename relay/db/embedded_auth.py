"""Who may log in to the embedded server (issue 14 item 2; relay.db.embedded's docstring):
the superuser's password in a private file of the data dir, and our `pg_hba.conf`
(loopback TCP with the password, nothing else). The files only; setting the password in
a stopped or running server is `EmbeddedPostgres._lock_down`.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from engram_sync.relay.db.embedded_install import Account, EmbeddedPostgresError, event

#: The database superuser created by initdb (not a system account).
SUPERUSER = "postgres"
#: The superuser's password, in the data dir (mode 0600).
PASSWORD_FILE = "engram-relay.password"  # noqa: S105 - a file name
# Our pg_hba.conf: loopback TCP with a password, nothing else (no socket, no trust).
HBA = """\
# Written by engram-relay (relay/db/embedded.py), rewritten on start if changed.
# TCP on 127.0.0.1 only, and every login needs the password (scram-sha-256).
# TYPE  DATABASE  USER  ADDRESS       METHOD
host    all       all   127.0.0.1/32  scram-sha-256
"""


def write_private(path: Path, text: str, account: Account | None) -> None:
    """Write ``text`` to ``path`` atomically: mode 0600, owned by the server's OS user."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(tmp, flags, 0o600)
    with os.fdopen(fd, "w") as handle:
        if account is not None:
            os.fchown(handle.fileno(), account.uid, account.gid)
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def read_password(password_file: Path) -> str | None:
    """The stored password, or None when there is none (an older data dir)."""
    try:
        st = password_file.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise EmbeddedPostgresError(
            f"{password_file} is not a regular file; remove it and start again "
            "(a new password is then set)"
        )
    if st.st_mode & 0o077:
        password_file.chmod(0o600)
        event(logging.WARNING, "made the password file private", path=password_file)
    password = password_file.read_text().strip()
    return password or None


def hba_locked(data_dir: Path) -> bool:
    """Whether the data dir's `pg_hba.conf` is ours, as written (`HBA`)."""
    try:
        return (data_dir / "pg_hba.conf").read_text() == HBA
    except FileNotFoundError:
        return False


def alter_role_sql(password: str) -> str:
    """The statements that set the superuser's password (scram-sha-256)."""
    literal = password.replace("'", "''")
    return (
        "SET password_encryption = 'scram-sha-256';\n"
        f"ALTER ROLE {SUPERUSER} PASSWORD '{literal}';\n"
    )


def scrub(text: str, secret: str) -> str:
    """``text`` (a tool's output) with ``secret`` hidden, safe for an error message."""
    return text.replace(secret, "***")
