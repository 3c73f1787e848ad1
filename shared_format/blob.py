"""Sealing and opening blobs (PROTOCOL §3).

ciphertext = base64(nonce(12) ‖ AES-256-GCM(enc_key, nonce, plaintext)), no AAD.
hmac = base64(HMAC-SHA256(hmac_key, vault_id ‖ memory_id ‖ device_id ‖
u64le(vector_clock) ‖ ascii(ciphertext text) ‖ deleted byte ‖ created_at)).

Opening verifies the HMAC first (constant time), then decodes, then decrypts;
each failure is its own typed error and nothing is returned.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .b64 import Base64Error, b64decode_std, b64encode_std
from .errors import BlobDecryptError, BlobMalformedError, BlobTamperedError
from .sync_keys import SyncKeys
from .timestamps import utc_now_rfc3339
from .wire import SyncBlob

NONCE_LEN: Final = 12
TAG_LEN: Final = 16
MIN_CIPHERTEXT_BYTES: Final = NONCE_LEN + TAG_LEN  # PROTOCOL §6 step 1: 28 bytes
HMAC_LEN: Final = 32
_U64: Final = struct.Struct("<Q")


def _utf8(value: str, name: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise BlobMalformedError(f"{name} is not valid Unicode text") from None


def blob_hmac(
    hmac_key: bytes,
    *,
    vault_id: str,
    memory_id: str,
    device_id: str,
    vector_clock: int,
    ciphertext: str,
    deleted: bool,
    created_at: str,
) -> bytes:
    """The raw 32-byte HMAC over the seven authenticated fields (PROTOCOL §3)."""
    if not 0 <= vector_clock < 2**64:
        raise BlobMalformedError("vector_clock is outside the unsigned 64-bit range")
    try:
        ciphertext_ascii = ciphertext.encode("ascii")
    except UnicodeEncodeError:
        raise BlobMalformedError("ciphertext is not ASCII base64 text") from None
    mac = hmac.new(hmac_key, digestmod=hashlib.sha256)
    mac.update(_utf8(vault_id, "vault_id"))
    mac.update(_utf8(memory_id, "memory_id"))
    mac.update(_utf8(device_id, "device_id"))
    mac.update(_U64.pack(vector_clock))
    mac.update(ciphertext_ascii)
    mac.update(b"\x01" if deleted else b"\x00")
    mac.update(_utf8(created_at, "created_at"))
    return mac.digest()


class BlobCipher:
    """Seals and opens blobs under one vault's sync keys (reuse it: derive keys once)."""

    def __init__(self, keys: SyncKeys) -> None:
        self._aead = AESGCM(keys.enc_key)
        self._hmac_key = keys.hmac_key

    def seal(
        self,
        plaintext: str,
        *,
        vault_id: str,
        memory_id: str,
        device_id: str,
        vector_clock: int,
        deleted: bool,
        created_at: str | None = None,
    ) -> SyncBlob:
        """Encrypt and authenticate one plaintext; `created_at` defaults to now (+00:00)."""
        stamp = created_at if created_at is not None else utc_now_rfc3339()
        nonce = os.urandom(NONCE_LEN)
        sealed = self._aead.encrypt(nonce, _utf8(plaintext, "plaintext"), None)
        ciphertext = b64encode_std(nonce + sealed)
        mac = blob_hmac(
            self._hmac_key,
            vault_id=vault_id,
            memory_id=memory_id,
            device_id=device_id,
            vector_clock=vector_clock,
            ciphertext=ciphertext,
            deleted=deleted,
            created_at=stamp,
        )
        return SyncBlob(
            vault_id=vault_id,
            memory_id=memory_id,
            device_id=device_id,
            vector_clock=vector_clock,
            ciphertext=ciphertext,
            hmac=b64encode_std(mac),
            created_at=stamp,
            deleted=deleted,
        )

    def verify(self, blob: SyncBlob) -> None:
        """Check the blob's HMAC in constant time; BlobTamperedError if it does not match."""
        try:
            claimed = b64decode_std(blob.hmac)
        except Base64Error:
            raise BlobTamperedError("hmac is not valid base64: blob rejected") from None
        if len(claimed) != HMAC_LEN:
            raise BlobTamperedError(f"hmac decodes to {len(claimed)} bytes, not {HMAC_LEN}")
        expected = blob_hmac(
            self._hmac_key,
            vault_id=blob.vault_id,
            memory_id=blob.memory_id,
            device_id=blob.device_id,
            vector_clock=blob.vector_clock,
            ciphertext=blob.ciphertext,
            deleted=blob.deleted,
            created_at=blob.created_at,
        )
        if not hmac.compare_digest(claimed, expected):
            raise BlobTamperedError(
                f"HMAC mismatch for memory {blob.memory_id[:64]!r}: sealed under other keys "
                "(a device with a different passphrase?) or modified on the way"
            )

    def open(self, blob: SyncBlob) -> str:
        """Verify → decode → decrypt (PROTOCOL §3); returns the UTF-8 plaintext text."""
        self.verify(blob)
        try:
            raw = b64decode_std(blob.ciphertext)
        except Base64Error as exc:
            raise BlobMalformedError(f"ciphertext is not valid base64: {exc}") from None
        if len(raw) < MIN_CIPHERTEXT_BYTES:
            raise BlobMalformedError(
                f"ciphertext is {len(raw)} bytes, shorter than nonce+tag ({MIN_CIPHERTEXT_BYTES})"
            )
        try:
            plaintext = self._aead.decrypt(raw[:NONCE_LEN], raw[NONCE_LEN:], None)
        except InvalidTag:
            raise BlobDecryptError(
                "AES-GCM tag did not verify: the blob was encrypted under another key"
            ) from None
        try:
            return plaintext.decode("utf-8")
        except UnicodeDecodeError:
            raise BlobMalformedError("decrypted plaintext is not UTF-8") from None
