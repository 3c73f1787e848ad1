"""Key wraps of the zero-knowledge account layer (PROTOCOL §13).

- Account key A: 32 random bytes made on a client.
- Wrap key: Argon2id(secret UTF-8, random 16-byte salt, m=65536, t=3, p=4) -> 32 bytes.
  Secrets are the account password (no normalisation) and the normalised
  recovery phrase (see :mod:`shared_format.recovery`).
- Envelope of A: nonce(12) ‖ AES-256-GCM(wrap key, A), no AAD -> 60 bytes.
- Vault key K = enc_key(32) ‖ hmac_key(32) ‖ UTF-8(vault_id), wrapped under A
  the same way: nonce(12) ‖ AES-256-GCM(A, K) -> 12 + len(K) + 16 bytes, at most
  512 bytes (the relay's cap per wrap). On unwrap the vault_id suffix is checked.

Unwrap failures raise :class:`KeyUnwrapError`; invalid arguments on the wrapping
side (a caller bug) raise ``ValueError``. No message contains key material.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import KeyUnwrapError
from .kdf import argon2id

__all__ = [
    "ACCOUNT_KEY_LEN",
    "MAX_K_LEN",
    "MAX_SALT_LEN",
    "MAX_WRAP_LEN",
    "MIN_K_LEN",
    "MIN_SALT_LEN",
    "NONCE_LEN",
    "SALT_LEN",
    "TAG_LEN",
    "WRAP_ENVELOPE_LEN",
    "WRAP_KEY_MEMORY_KIB",
    "VaultKey",
    "derive_wrap_key",
    "new_account_key",
    "pack_vault_key",
    "unpack_vault_key",
    "unwrap_secret",
    "unwrap_vault_key",
    "unwrap_with_secret",
    "wrap_secret",
    "wrap_vault_key",
    "wrap_with_secret",
]

# PROTOCOL §13 constants.
ACCOUNT_KEY_LEN = 32
NONCE_LEN = 12
TAG_LEN = 16
WRAP_ENVELOPE_LEN = NONCE_LEN + ACCOUNT_KEY_LEN + TAG_LEN  # 60
SALT_LEN = 16
MIN_SALT_LEN = 16  # what writers make; shorter salts are refused on read
MAX_SALT_LEN = 64  # relay cap per salt
MAX_WRAP_LEN = 512  # relay cap per wrap (decoded bytes)
WRAP_KEY_MEMORY_KIB = 65536
WRAP_KEY_TIME_COST = 3
WRAP_KEY_PARALLELISM = 4
_HALF = 32
MIN_K_LEN = 2 * _HALF + 1  # a vault_id is never empty
MAX_K_LEN = MAX_WRAP_LEN - NONCE_LEN - TAG_LEN  # 484: largest K whose wrap fits the cap


@dataclass(frozen=True)
class VaultKey:
    """An unpacked vault key K. Key bytes are kept out of ``repr``."""

    enc_key: bytes = field(repr=False)
    hmac_key: bytes = field(repr=False)
    vault_id: str


def new_account_key() -> bytes:
    """A fresh account key A: 32 bytes from the OS CSPRNG (PROTOCOL §13)."""
    return secrets.token_bytes(ACCOUNT_KEY_LEN)


def _check_salt(salt: bytes) -> None:
    if not MIN_SALT_LEN <= len(salt) <= MAX_SALT_LEN:
        raise KeyUnwrapError(
            f"wrap salt must be {MIN_SALT_LEN}..{MAX_SALT_LEN} bytes, got {len(salt)}"
        )


def derive_wrap_key(secret: str, salt: bytes) -> bytes:
    """Argon2id(UTF-8 secret, salt, m=65536 KiB, t=3, p=4) -> 32-byte wrap key.

    PROTOCOL §13. The secret is used as its raw UTF-8 bytes, not normalised here.
    Raises KeyUnwrapError for a salt outside 16..64 bytes or a secret that is not
    encodable as UTF-8 (lone surrogates).
    """
    _check_salt(salt)
    try:
        secret_bytes = secret.encode("utf-8")
    except UnicodeEncodeError:
        raise KeyUnwrapError("secret is not valid Unicode text") from None
    return argon2id(
        secret_bytes,
        salt,
        memory_kib=WRAP_KEY_MEMORY_KIB,
        time_cost=WRAP_KEY_TIME_COST,
        parallelism=WRAP_KEY_PARALLELISM,
    )


def _seal(key: bytes, plaintext: bytes) -> bytes:
    """nonce(12) ‖ AES-256-GCM(key, plaintext), no AAD."""
    if len(key) != 32:
        raise ValueError("wrapping key must be 32 bytes")
    nonce = secrets.token_bytes(NONCE_LEN)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, None)


def _open(key: bytes, envelope: bytes, what: str) -> bytes:
    if len(key) != 32:
        raise KeyUnwrapError(f"cannot unwrap {what}: unwrapping key must be 32 bytes")
    try:
        return AESGCM(key).decrypt(envelope[:NONCE_LEN], envelope[NONCE_LEN:], None)
    except InvalidTag:
        raise KeyUnwrapError(
            f"cannot unwrap {what}: wrong key or secret, or the envelope was modified"
        ) from None


def wrap_secret(secret32: bytes, wrap_key: bytes) -> bytes:
    """Wrap a 32-byte secret (A): nonce ‖ AES-GCM(wrap_key, secret32) -> 60 bytes."""
    # PROTOCOL §13: envelope = nonce(12) ‖ AES-256-GCM(wrap key, A), no AAD.
    if len(secret32) != ACCOUNT_KEY_LEN:
        raise ValueError(f"the wrapped secret must be {ACCOUNT_KEY_LEN} bytes")
    envelope = _seal(wrap_key, secret32)
    assert len(envelope) == WRAP_ENVELOPE_LEN
    return envelope


def unwrap_secret(envelope: bytes, wrap_key: bytes) -> bytes:
    """Open a 60-byte envelope; KeyUnwrapError on wrong length, wrong key or tamper."""
    if len(envelope) != WRAP_ENVELOPE_LEN:
        raise KeyUnwrapError(
            f"wrapped key envelope must be {WRAP_ENVELOPE_LEN} bytes, got {len(envelope)}"
        )
    return _open(wrap_key, envelope, "account key")


def wrap_with_secret(secret32: bytes, password: str) -> tuple[bytes, bytes]:
    """Wrap ``secret32`` under a password or recovery phrase; returns (envelope, salt).

    A fresh random 16-byte salt is made for every wrap (PROTOCOL §13).
    """
    if len(secret32) != ACCOUNT_KEY_LEN:
        raise ValueError(f"the wrapped secret must be {ACCOUNT_KEY_LEN} bytes")
    salt = secrets.token_bytes(SALT_LEN)
    return wrap_secret(secret32, derive_wrap_key(password, salt)), salt


def unwrap_with_secret(envelope: bytes, salt: bytes, password: str) -> bytes:
    """Inverse of :func:`wrap_with_secret`; KeyUnwrapError on any failure."""
    if len(envelope) != WRAP_ENVELOPE_LEN:  # fail before paying for Argon2id
        raise KeyUnwrapError(
            f"wrapped key envelope must be {WRAP_ENVELOPE_LEN} bytes, got {len(envelope)}"
        )
    return unwrap_secret(envelope, derive_wrap_key(password, salt))


def pack_vault_key(enc_key: bytes, hmac_key: bytes, vault_id: str) -> bytes:
    """K = enc_key(32) ‖ hmac_key(32) ‖ UTF-8(vault_id) (PROTOCOL §13).

    ValueError if a key is not 32 bytes, the vault_id is empty, or K would be
    longer than 484 bytes (its wrap would exceed the relay's 512-byte cap).
    """
    if len(enc_key) != _HALF or len(hmac_key) != _HALF:
        raise ValueError("enc_key and hmac_key must be 32 bytes each")
    if not vault_id:
        raise ValueError("vault_id must not be empty")
    k = enc_key + hmac_key + vault_id.encode("utf-8")
    if len(k) > MAX_K_LEN:
        raise ValueError(
            f"vault_id is too long to wrap: K would be {len(k)} bytes, the maximum is {MAX_K_LEN}"
        )
    return k


def unpack_vault_key(k: bytes, expected_vault_id: str | None) -> VaultKey:
    """Split K; KeyUnwrapError if malformed or its vault_id differs from the expected one.

    ``expected_vault_id=None`` skips the vault_id comparison (use it only where
    the vault is not known yet; PROTOCOL §13/§14 want the suffix checked).
    """
    if len(k) < MIN_K_LEN:
        raise KeyUnwrapError(f"vault key must be at least {MIN_K_LEN} bytes, got {len(k)}")
    try:
        vault_id = k[2 * _HALF :].decode("utf-8")
    except UnicodeDecodeError:
        raise KeyUnwrapError("vault key's vault_id suffix is not valid UTF-8") from None
    # PROTOCOL §13: on unwrap, check the vault_id suffix.
    if expected_vault_id is not None and vault_id != expected_vault_id:
        raise KeyUnwrapError(
            f"vault key belongs to vault {vault_id!r}, not to {expected_vault_id!r}"
        )
    return VaultKey(enc_key=k[:_HALF], hmac_key=k[_HALF : 2 * _HALF], vault_id=vault_id)


def wrap_vault_key(k_bytes: bytes, account_key_a: bytes) -> bytes:
    """wrapped_k = nonce(12) ‖ AES-256-GCM(A, K), no AAD (PROTOCOL §13)."""
    if not MIN_K_LEN <= len(k_bytes) <= MAX_K_LEN:
        raise ValueError(f"vault key must be {MIN_K_LEN}..{MAX_K_LEN} bytes, got {len(k_bytes)}")
    try:
        k_bytes[2 * _HALF :].decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("vault key's vault_id suffix is not valid UTF-8") from None
    if len(account_key_a) != ACCOUNT_KEY_LEN:
        raise ValueError(f"account key must be {ACCOUNT_KEY_LEN} bytes")
    return _seal(account_key_a, k_bytes)


def unwrap_vault_key(envelope: bytes, account_key_a: bytes, expected_vault_id: str) -> VaultKey:
    """Open wrapped_k under A and check its vault_id; KeyUnwrapError on any failure."""
    lo, hi = NONCE_LEN + MIN_K_LEN + TAG_LEN, MAX_WRAP_LEN
    if not lo <= len(envelope) <= hi:
        raise KeyUnwrapError(f"wrapped vault key must be {lo}..{hi} bytes, got {len(envelope)}")
    k = _open(account_key_a, envelope, "vault key")
    return unpack_vault_key(k, expected_vault_id)
