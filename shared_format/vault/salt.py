"""The `salt` file of a passphrase vault (VAULT §1, §2)."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Final

from ..errors import VaultError
from ..kdf import domain_salt
from .sqlcipher_key import SALT_LEN

SALT_FILE_NAME: Final = "salt"
FALLBACK_SALT_TAG: Final = "axiom-engram-vault-v2"


def salt_path(vault_dir: Path) -> Path:
    """Where the salt file of the vault at `vault_dir` lives."""
    return vault_dir / SALT_FILE_NAME


def vault_salt16(vault_dir: Path) -> bytes:
    """The 16-byte Argon2id salt of a vault (VAULT §2).

    The first 16 bytes of `salt` when it holds at least 16 bytes; otherwise
    (absent or short) the first 16 bytes of SHA-256("axiom-engram-vault-v2").
    A salt file that exists but cannot be read raises VaultError.
    """
    path = salt_path(vault_dir)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    except OSError as exc:
        raise VaultError(f"cannot read the vault salt file {path}: {exc.strerror}") from None
    if len(data) >= SALT_LEN:
        return data[:SALT_LEN]
    return domain_salt(FALLBACK_SALT_TAG)


def write_new_salt(vault_dir: Path) -> None:
    """Write 16 fresh random bytes to `salt` (mode 0600), durably.

    Refuses (VaultError) to replace an existing salt file: the salt is part of
    the key of any vault made with it.
    """
    path = salt_path(vault_dir)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise VaultError(f"refusing to replace the existing salt file {path}") from None
    except OSError as exc:
        raise VaultError(f"cannot create the vault salt file {path}: {exc.strerror}") from None
    try:
        remaining = memoryview(secrets.token_bytes(SALT_LEN))
        while remaining:
            remaining = remaining[os.write(fd, remaining) :]
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise VaultError(f"cannot write the vault salt file {path}: {exc.strerror}") from None
    os.close(fd)
    _fsync_dir(vault_dir)


def _fsync_dir(directory: Path) -> None:
    """Make a new directory entry durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
