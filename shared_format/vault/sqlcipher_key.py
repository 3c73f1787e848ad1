"""The three SQLCipher key derivations of a vault (VAULT §2).

Every derivation returns the 64 lowercase hex characters that are given to
SQLCipher as a quoted passphrase. Nothing here logs or reports its inputs.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Final

from ..errors import VaultError
from ..kdf import argon2id

# VAULT §2 constants.
PASSPHRASE_KEY_MEMORY_KIB: Final = 65536
PASSPHRASE_KEY_TIME_COST: Final = 3
PASSPHRASE_KEY_PARALLELISM: Final = 4
SALT_LEN: Final = 16
MACHINE_KEY_SUFFIX: Final = ":axiom-engram-vault-v1"
LEGACY_KEY_SUFFIX: Final = ":axiom-engram-vault-v1"
MACHINE_ID_PATH: Final = Path("/etc/machine-id")
BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")

_KEY_HEX: Final = re.compile(r"[0-9a-f]{64}")

MachineIdSource = Callable[[], str]
"""A callable returning this machine's id (injectable so tests need no /etc)."""


def is_vault_key(key: str) -> bool:
    """Whether `key` has the shape of a vault key: exactly 64 lowercase hex characters."""
    return _KEY_HEX.fullmatch(key) is not None


def passphrase_vault_key(passphrase: str, salt16: bytes) -> str:
    """Current passphrase key: hex(Argon2id(passphrase, salt16, m=64 MiB, t=3, p=4)).

    `salt16` is what `vault_salt16()` returns for the vault directory.
    """
    # VAULT §2 "Passphrase vault (current)"
    if len(salt16) != SALT_LEN:
        raise ValueError(f"the vault salt must be {SALT_LEN} bytes, got {len(salt16)}")
    return argon2id(
        passphrase.encode("utf-8"),
        salt16,
        memory_kib=PASSPHRASE_KEY_MEMORY_KIB,
        time_cost=PASSPHRASE_KEY_TIME_COST,
        parallelism=PASSPHRASE_KEY_PARALLELISM,
    ).hex()


def legacy_passphrase_vault_key(passphrase: str) -> str:
    """Legacy passphrase key: hex(SHA-256(passphrase + ":axiom-engram-vault-v1"))."""
    # VAULT §2 "Legacy passphrase vault"
    return hashlib.sha256((passphrase + LEGACY_KEY_SUFFIX).encode("utf-8")).hexdigest()


def machine_vault_key(machine_id: str) -> str:
    """Machine key: hex(SHA-256(machine_id + ":axiom-engram-vault-v1"))."""
    # VAULT §2 "Machine-key vault"
    return hashlib.sha256((machine_id + MACHINE_KEY_SUFFIX).encode("utf-8")).hexdigest()


def _read_trimmed(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def read_machine_id(
    machine_id_path: Path = MACHINE_ID_PATH, boot_id_path: Path = BOOT_ID_PATH
) -> str:
    """This machine's id: `/etc/machine-id` trimmed, else the kernel boot id (VAULT §2).

    Raises VaultError when neither file gives a non-empty value.
    """
    for path in (machine_id_path, boot_id_path):
        machine_id = _read_trimmed(path)
        if machine_id:
            return machine_id
    raise VaultError(
        f"no machine id: neither {machine_id_path} nor {boot_id_path} is readable and non-empty"
    )
