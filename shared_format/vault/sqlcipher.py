"""The SQLCipher connection layer of a vault: connect, key, probe, rekey (VAULT §2).

`sqlcipher3` has the same DB-API as the standard `sqlite3` module but its own
classes: its connections are typed here as `sqlite3.Connection` (same methods)
and its exceptions are re-exported, because `except sqlite3.IntegrityError`
does NOT catch an error raised by a vault connection; use the names below.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final, cast

import sqlcipher3

from .sqlcipher_key import is_vault_key

# The exception classes a vault connection raises (sqlcipher3's, not sqlite3's).
Error: Final = cast(type[sqlite3.Error], sqlcipher3.Error)
DatabaseError: Final = cast(type[sqlite3.DatabaseError], sqlcipher3.DatabaseError)
IntegrityError: Final = cast(type[sqlite3.IntegrityError], sqlcipher3.IntegrityError)
OperationalError: Final = cast(type[sqlite3.OperationalError], sqlcipher3.OperationalError)

SQLITE_NOTADB: Final = 26  # what SQLCipher answers when the key does not decrypt page 1
BUSY_TIMEOUT_MS: Final = 5000


def connect(db_path: Path, *, create: bool) -> sqlite3.Connection:
    """Open `db_path` in autocommit mode; never creates the file unless `create`."""
    mode = "rwc" if create else "rw"
    conn = sqlcipher3.connect(
        f"{db_path.resolve().as_uri()}?mode={mode}", uri=True, isolation_level=None
    )
    return cast(sqlite3.Connection, conn)


def _key_pragma(conn: sqlite3.Connection, pragma: str, key: str) -> None:
    # The key is interpolated into SQL, so its shape is checked first; the error
    # never repeats it.
    if not is_vault_key(key):
        raise ValueError("a vault key must be exactly 64 lowercase hex characters")
    # VAULT §2: a quoted passphrase (not x'..'), and no cipher_* settings.
    conn.execute(f"PRAGMA {pragma} = '{key}'").fetchall()


def apply_key(conn: sqlite3.Connection, key: str) -> None:
    """`PRAGMA key = '<64 hex>'` then `busy_timeout=5000` (VAULT §2)."""
    _key_pragma(conn, "key", key)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}").fetchall()


def rekey(conn: sqlite3.Connection, key: str) -> None:
    """`PRAGMA rekey = '<64 hex>'` on a connection opened with the old key (VAULT §2)."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    _key_pragma(conn, "rekey", key)


def finish_open(conn: sqlite3.Connection) -> None:
    """The pragmas after a key opened the database: foreign keys on, then WAL (VAULT §2)."""
    conn.execute("PRAGMA foreign_keys = ON").fetchall()
    conn.execute("PRAGMA journal_mode = WAL").fetchall()


@contextmanager
def _quiet_cipher_log(conn: sqlite3.Connection) -> Iterator[None]:
    """Silence SQLCipher's stderr log while probing a key that may be wrong.

    SQLCipher logs every failed HMAC check to stderr, which a person would see
    as scary noise on each fallback attempt. `cipher_log_level` only concerns
    that diagnostic log (process-wide), not the database format, and is put back.
    """
    row = conn.execute("PRAGMA cipher_log_level").fetchone()
    previous = str(row[0]) if row is not None else None
    conn.execute("PRAGMA cipher_log_level = NONE").fetchall()
    try:
        yield
    finally:
        if previous is not None and previous.isalpha():
            conn.execute(f"PRAGMA cipher_log_level = {previous}").fetchall()


def key_opens(conn: sqlite3.Connection) -> bool:
    """Whether the key set on `conn` decrypts the database (a cheap read of sqlite_master).

    False only for SQLCipher's "file is not a database" answer; any other error
    (locked, I/O, corruption) is raised so it is not mistaken for a wrong key.
    """
    try:
        with _quiet_cipher_log(conn):
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except DatabaseError as exc:
        if getattr(exc, "sqlite_errorcode", SQLITE_NOTADB) == SQLITE_NOTADB:
            return False
        raise
    return True


def try_key(db_path: Path, key: str) -> sqlite3.Connection | None:
    """A keyed connection to an existing database if `key` opens it, else None.

    Opens read-write without create, so a failed attempt leaves no file behind.
    """
    conn = connect(db_path, create=False)
    try:
        apply_key(conn, key)
        if key_opens(conn):
            return conn
    except BaseException:
        conn.close()
        raise
    conn.close()
    return None
