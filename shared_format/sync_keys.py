"""Sync key derivation from a passphrase (PROTOCOL §2).

Argon2id v0x13, t=3, p=4, 32-byte output, salt = SHA-256(domain tag)[0:16].
Derive once per process, never per blob.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from .kdf import argon2id, domain_salt

ENC_TAG: Final = "axiom-sync-enc-v2"
HMAC_TAG: Final = "axiom-sync-hmac-v2"
VAULT_ID_V2_TAG: Final = "axiom-sync-vaultid-v2"
VAULT_ID_V1_TAG: Final = "axiom-sync-vaultid-v1"

_KEY_MEMORY_KIB: Final = 65536
_VAULT_ID_V2_MEMORY_KIB: Final = 98304
_VAULT_ID_V1_MEMORY_KIB: Final = 65536


@dataclass(frozen=True, repr=False)
class SyncKeys:
    """The two 32-byte sync keys of a vault. `repr` never shows them."""

    enc_key: bytes
    hmac_key: bytes

    def __post_init__(self) -> None:
        if len(self.enc_key) != 32 or len(self.hmac_key) != 32:
            raise ValueError("enc_key and hmac_key must be 32 bytes each")

    def __repr__(self) -> str:
        return "SyncKeys(<redacted>)"


def _derive(passphrase: str, tag: str, memory_kib: int) -> bytes:
    # PROTOCOL §2: raw UTF-8 bytes of the passphrase, no normalisation.
    return argon2id(passphrase.encode("utf-8"), domain_salt(tag), memory_kib=memory_kib)


def derive_sync_keys(passphrase: str) -> SyncKeys:
    """enc_key and hmac_key from a passphrase, both derivations in parallel threads."""
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="argon2") as pool:
        enc = pool.submit(_derive, passphrase, ENC_TAG, _KEY_MEMORY_KIB)
        mac = pool.submit(_derive, passphrase, HMAC_TAG, _KEY_MEMORY_KIB)
        return SyncKeys(enc_key=enc.result(), hmac_key=mac.result())


def vault_id_v2(passphrase: str) -> str:
    """The current derived vault id: 64 lowercase hex characters (PROTOCOL §2)."""
    return _derive(passphrase, VAULT_ID_V2_TAG, _VAULT_ID_V2_MEMORY_KIB).hex()


def vault_id_v1(passphrase: str) -> str:
    """The legacy derived vault id: 64 lowercase hex characters (PROTOCOL §2)."""
    return _derive(passphrase, VAULT_ID_V1_TAG, _VAULT_ID_V1_MEMORY_KIB).hex()
