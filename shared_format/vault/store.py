"""Opening and creating a vault directory (VAULT §1, §2), with schema v10 applied (§3)."""

from __future__ import annotations

import enum
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from ..errors import VaultError, WrongPassphraseError
from . import sqlcipher
from .salt import salt_path, vault_salt16, write_new_salt
from .schema import apply_schema
from .sqlcipher_key import (
    MachineIdSource,
    legacy_passphrase_vault_key,
    machine_vault_key,
    passphrase_vault_key,
    read_machine_id,
)

DB_FILE_NAME: Final = "engrams.db"


class VaultKeyKind(enum.StrEnum):
    """Which derivation keys the open vault (VAULT §2).

    PASSPHRASE: Argon2id of a passphrase (current, or legacy and just rekeyed);
    the only kind that can sync. MACHINE: SHA-256 of the machine id; protects a
    stolen disk, not against a local user, and cannot sync.
    """

    PASSPHRASE = "passphrase"  # noqa: S105 - an enum value, not a secret
    MACHINE = "machine"


class Vault:
    """An open vault: a keyed SQLCipher connection at schema v10.

    `conn` is in autocommit mode (`isolation_level=None`): group writes with
    `transaction()` (or explicit BEGIN/COMMIT). Its errors are sqlcipher3's
    classes, re-exported by this package (`IntegrityError`, ...).
    """

    def __init__(
        self,
        path: Path,
        conn: sqlite3.Connection,
        key_kind: VaultKeyKind,
        *,
        rekeyed_from_legacy: bool = False,
    ) -> None:
        self.path = path
        self.conn = conn
        self.key_kind = key_kind
        self.rekeyed_from_legacy = rekeyed_from_legacy
        self._closed = False

    @property
    def db_path(self) -> Path:
        """The database file, `<path>/engrams.db`."""
        return self.path / DB_FILE_NAME

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if not self._closed:
            self._closed = True
            self.conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """`BEGIN IMMEDIATE` ... `COMMIT`, or `ROLLBACK` when the block raises."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"Vault({str(self.path)!r}, {self.key_kind.value}, {state})"


def open_vault(
    path: Path,
    passphrase: str | None,
    *,
    create: bool = False,
    machine_id: MachineIdSource = read_machine_id,
) -> Vault:
    """Open the vault directory `path`, or create it when `create` and it has no database.

    With a passphrase, an existing vault is tried with the current Argon2id key,
    then the legacy SHA-256 key (and then rekeyed to the current key, writing a
    salt file if missing), then the machine key. With `passphrase=None` only the
    machine key is tried. No key opens it: WrongPassphraseError, and nothing
    beside the vault was created or changed. A new passphrase vault gets a fresh
    random `salt` file; a new vault without a passphrase is machine-keyed.
    `machine_id` supplies the machine id (tests inject one).
    """
    vault_dir = Path(path)
    db_path = vault_dir / DB_FILE_NAME
    if vault_dir.exists() and not vault_dir.is_dir():
        raise VaultError(f"{vault_dir} is not a directory: a vault is a directory with engrams.db")
    rekeyed = False
    try:
        if _has_database(db_path):
            conn, kind, rekeyed = _open_existing(vault_dir, db_path, passphrase, machine_id)
        elif create:
            conn, kind = _create(vault_dir, db_path, passphrase, machine_id)
        elif db_path.exists():
            raise VaultError(f"the vault database {db_path} is empty; open it with create=True")
        else:
            raise VaultError(f"no Engram vault at {vault_dir}: {db_path.name} does not exist")
    except sqlcipher.Error as exc:
        raise VaultError(f"could not open the vault database {db_path}: {exc}") from exc
    _prepare(conn, vault_dir)
    return Vault(vault_dir, conn, kind, rekeyed_from_legacy=rekeyed)


def open_vault_with_key(path: Path, key: str, kind: VaultKeyKind) -> Vault | None:
    """Open the existing vault `path` with its database key already derived (VAULT §2: the
    64 hex characters; the key agent, docs/agent.md); None when that key does not open it.
    Nothing else is tried and nothing is created."""
    vault_dir = Path(path)
    db_path = vault_dir / DB_FILE_NAME
    if not _has_database(db_path):
        raise VaultError(f"no Engram vault at {vault_dir}: {db_path.name} does not exist")
    try:
        conn = sqlcipher.try_key(db_path, key)
    except sqlcipher.Error as exc:
        raise VaultError(f"could not open the vault database {db_path}: {exc}") from exc
    if conn is None:
        return None
    _prepare(conn, vault_dir)
    return Vault(vault_dir, conn, kind)


def _prepare(conn: sqlite3.Connection, vault_dir: Path) -> None:
    """The pragmas after keying and schema v10 (VAULT §2, §3); closes `conn` on failure."""
    try:
        sqlcipher.finish_open(conn)
        apply_schema(conn)
    except sqlcipher.Error as exc:
        conn.close()
        raise VaultError(f"could not prepare the vault at {vault_dir}: {exc}") from exc
    except BaseException:
        conn.close()
        raise


def _has_database(db_path: Path) -> bool:
    """A non-empty engrams.db (an empty file is what a crashed creation leaves)."""
    return db_path.is_file() and db_path.stat().st_size > 0


def _open_existing(
    vault_dir: Path, db_path: Path, passphrase: str | None, machine_id: MachineIdSource
) -> tuple[sqlite3.Connection, VaultKeyKind, bool]:
    """VAULT §2 open order: current, legacy (then rekey), machine key."""
    if passphrase is not None:
        salt16 = vault_salt16(vault_dir)
        current_key = passphrase_vault_key(passphrase, salt16)
        conn = sqlcipher.try_key(db_path, current_key)
        if conn is not None:
            return conn, VaultKeyKind.PASSPHRASE, False
        conn = sqlcipher.try_key(db_path, legacy_passphrase_vault_key(passphrase))
        if conn is not None:
            try:
                _rekey_legacy(conn, vault_dir, passphrase, salt16, current_key)
            except BaseException:
                conn.close()
                raise
            return conn, VaultKeyKind.PASSPHRASE, True
        try:
            machine_key = machine_vault_key(machine_id())
        except VaultError:
            machine_key = None  # no machine id here: that fallback cannot apply
    else:
        machine_key = machine_vault_key(machine_id())
    if machine_key is not None:
        conn = sqlcipher.try_key(db_path, machine_key)
        if conn is not None:
            return conn, VaultKeyKind.MACHINE, False
    if passphrase is None:
        raise WrongPassphraseError(
            f"wrong passphrase or not an Engram vault: {db_path} does not open with this"
            " machine's key (a passphrase vault needs its passphrase)"
        )
    raise WrongPassphraseError(
        f"wrong passphrase or not an Engram vault: no key derived from this passphrase"
        f" (nor the machine key) opens {db_path}"
    )


def _rekey_legacy(
    conn: sqlite3.Connection,
    vault_dir: Path,
    passphrase: str,
    salt16: bytes,
    current_key: str,
) -> None:
    """Move a legacy-keyed vault to the current derivation (VAULT §2).

    The salt file is written (durably) before the rekey, so the key the vault
    ends up with is always the one the next open derives.
    """
    if not salt_path(vault_dir).exists():
        write_new_salt(vault_dir)
    new_salt16 = vault_salt16(vault_dir)
    if new_salt16 != salt16:
        current_key = passphrase_vault_key(passphrase, new_salt16)
    sqlcipher.rekey(conn, current_key)


def _create(
    vault_dir: Path, db_path: Path, passphrase: str | None, machine_id: MachineIdSource
) -> tuple[sqlite3.Connection, VaultKeyKind]:
    """Create a new vault database (and `salt` for a passphrase vault)."""
    if passphrase == "":
        raise VaultError("refusing to create a vault with an empty passphrase")
    machine_key = machine_vault_key(machine_id()) if passphrase is None else None
    vault_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(vault_dir, 0o700)  # also when it existed or the umask was 000 (issue 13)
    if passphrase is None:
        assert machine_key is not None
        key, kind = machine_key, VaultKeyKind.MACHINE
    else:
        # VAULT §2: a new passphrase vault writes 16 random bytes to `salt`. A salt
        # file already there (without a database) is kept, never overwritten.
        if not salt_path(vault_dir).exists():
            write_new_salt(vault_dir)
        key = passphrase_vault_key(passphrase, vault_salt16(vault_dir))
        kind = VaultKeyKind.PASSPHRASE
    # The database (and so its -wal/-shm files, which SQLite gives the database's mode) is
    # 0600 whatever the umask.
    os.close(os.open(db_path, os.O_WRONLY | os.O_CREAT, 0o600))
    os.chmod(db_path, 0o600)
    conn = sqlcipher.connect(db_path, create=True)
    try:
        sqlcipher.apply_key(conn, key)
        if not sqlcipher.key_opens(conn):
            raise VaultError(f"could not create the vault database {db_path}")
    except BaseException:
        conn.close()
        raise
    return conn, kind
