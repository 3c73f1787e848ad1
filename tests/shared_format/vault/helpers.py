"""Helpers for the vault tests: hand-made SQLCipher files, independent key checks."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import sqlcipher3

from engram_sync.shared_format.vault import sqlcipher_key as keys

MACHINE_ID = "test-machine-0001"
OTHER_MACHINE_ID = "test-machine-0002"
PASSPHRASE = "correct-horse-battery-staple"

_derived: dict[tuple[str, bytes], str] = {}


def cached_passphrase_vault_key(passphrase: str, salt16: bytes) -> str:
    """The real Argon2id derivation, memoised for the whole test session (it costs ~0.2 s)."""
    memo_key = (passphrase, salt16)
    if memo_key not in _derived:
        _derived[memo_key] = keys.passphrase_vault_key(passphrase, salt16)
    return _derived[memo_key]


def this_machine() -> str:
    """Injected machine id source."""
    return MACHINE_ID


def other_machine() -> str:
    """A different machine's id."""
    return OTHER_MACHINE_ID


def raw_connect(db_path: Path, key: str) -> Any:
    """A plain sqlcipher3 connection keyed the VAULT §2 way (for hand-made vaults)."""
    conn = sqlcipher3.connect(str(db_path), isolation_level=None)
    conn.execute(f"PRAGMA key = '{key}'")
    return conn


def key_opens(db_path: Path, key: str) -> bool:
    """Whether `key` decrypts the database at `db_path` (independent of the code under test)."""
    conn = raw_connect(db_path, key)
    try:
        conn.execute("PRAGMA cipher_log_level = NONE")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlcipher3.DatabaseError:
        return False
    finally:
        conn.close()
    return True


def machine_key(machine_id: str = MACHINE_ID) -> str:
    """VAULT §2 machine key, computed independently of shared_format."""
    return hashlib.sha256(f"{machine_id}:axiom-engram-vault-v1".encode()).hexdigest()


def make_db(db_path: Path, key: str, script: str) -> None:
    """Build an encrypted database by hand (as another Engram tool would), in WAL mode."""
    db_path.parent.mkdir(parents=True, exist_ok=True)
    conn = raw_connect(db_path, key)
    try:
        conn.executescript(script)
        conn.execute("PRAGMA journal_mode = WAL")
    finally:
        conn.close()


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file in a directory with its bytes (to prove a failed open changed nothing)."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def plain_sqlite_error(db_path: Path) -> str:
    """The message the standard sqlite3 module gives when reading the file."""
    conn = sqlite3.connect(db_path)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        return str(exc)
    finally:
        conn.close()
    return ""
