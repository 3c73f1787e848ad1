"""VAULT §2 key derivations, the salt file and the machine id."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.kdf.argon2 import Argon2id

from engram_sync.shared_format.errors import VaultError
from engram_sync.shared_format.vault import (
    is_vault_key,
    legacy_passphrase_vault_key,
    machine_vault_key,
    passphrase_vault_key,
    read_machine_id,
    vault_salt16,
)
from engram_sync.shared_format.vault.salt import write_new_salt

from .helpers import MACHINE_ID, PASSPHRASE

# SHA-256("axiom-engram-vault-v2")[0:16], the salt of a vault without a usable salt file.
FALLBACK_SALT16 = bytes.fromhex("f2223abfbe45544d27c0bea2c45075c4")


def test_passphrase_key_matches_an_independent_argon2id() -> None:
    salt = bytes(range(16))
    expected = Argon2id(salt=salt, length=32, iterations=3, lanes=4, memory_cost=65536).derive(
        PASSPHRASE.encode()
    )
    assert passphrase_vault_key(PASSPHRASE, salt) == expected.hex()


def test_passphrase_key_rejects_a_wrong_salt_length() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        passphrase_vault_key(PASSPHRASE, b"short")


def test_legacy_key_known_answer() -> None:
    assert legacy_passphrase_vault_key(PASSPHRASE) == (
        "74259dc2f0ef46a7f8d61faf11907f516bb364dd977bd6cf8059ac022a7d2965"
    )


def test_machine_key_known_answer() -> None:
    assert machine_vault_key(MACHINE_ID) == (
        "8fa20ec05b5a11070bcb9bd00393a1d8640c1b2704391df3ac5312db2aab535d"
    )


def test_non_ascii_inputs_are_utf8() -> None:
    assert (
        legacy_passphrase_vault_key("pässwörd")
        == hashlib.sha256("pässwörd:axiom-engram-vault-v1".encode()).hexdigest()
    )


def test_key_shape() -> None:
    assert is_vault_key(machine_vault_key("x"))
    assert not is_vault_key("A" * 64)
    assert not is_vault_key("a" * 63)
    assert not is_vault_key("a" * 64 + "'")


def test_salt_from_file_first_16_bytes(tmp_path: Path) -> None:
    (tmp_path / "salt").write_bytes(bytes(range(40)))
    assert vault_salt16(tmp_path) == bytes(range(16))


@pytest.mark.parametrize("content", [None, b"", b"0123456789abcde"])
def test_salt_fallback_when_absent_or_short(tmp_path: Path, content: bytes | None) -> None:
    if content is not None:
        (tmp_path / "salt").write_bytes(content)
    assert vault_salt16(tmp_path) == FALLBACK_SALT16
    assert hashlib.sha256(b"axiom-engram-vault-v2").digest()[:16] == FALLBACK_SALT16


def test_unreadable_salt_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "salt").mkdir()
    with pytest.raises(VaultError, match="salt"):
        vault_salt16(tmp_path)


def test_new_salt_is_16_random_bytes_0600(tmp_path: Path) -> None:
    write_new_salt(tmp_path)
    salt = tmp_path / "salt"
    assert len(salt.read_bytes()) == 16
    assert stat.S_IMODE(os.stat(salt).st_mode) == 0o600
    other = tmp_path / "other"
    other.mkdir()
    write_new_salt(other)
    assert (other / "salt").read_bytes() != salt.read_bytes()


def test_new_salt_never_replaces_one(tmp_path: Path) -> None:
    (tmp_path / "salt").write_bytes(b"x" * 16)
    with pytest.raises(VaultError, match="refusing"):
        write_new_salt(tmp_path)
    assert (tmp_path / "salt").read_bytes() == b"x" * 16


def test_machine_id_trimmed(tmp_path: Path) -> None:
    machine_id = tmp_path / "machine-id"
    machine_id.write_text("  abc123\n")
    assert read_machine_id(machine_id, tmp_path / "boot_id") == "abc123"


@pytest.mark.parametrize("machine_id_content", [None, "", " \n"])
def test_boot_id_fallback(tmp_path: Path, machine_id_content: str | None) -> None:
    if machine_id_content is not None:
        (tmp_path / "machine-id").write_text(machine_id_content)
    (tmp_path / "boot_id").write_text("boot-1\n")
    assert read_machine_id(tmp_path / "machine-id", tmp_path / "boot_id") == "boot-1"


def test_no_machine_id(tmp_path: Path) -> None:
    with pytest.raises(VaultError, match="no machine id"):
        read_machine_id(tmp_path / "machine-id", tmp_path / "boot_id")
