"""Typed errors raised by shared_format.

Every failure of a decoder or a cryptographic check surfaces as one of these,
never as a raw library exception (binascii.Error, InvalidTag, msgspec errors...).
"""

from __future__ import annotations


class FormatError(Exception):
    """Base class of every error raised by shared_format."""


class WireDecodeError(FormatError):
    """A wire message (JSON) could not be decoded; the message names the field."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class BlobTamperedError(FormatError):
    """The blob's HMAC does not match: it was modified or made with another key."""


class BlobMalformedError(FormatError):
    """The blob passed its HMAC but could not be decoded (base64, lengths, UTF-8, JSON)."""


class BlobDecryptError(FormatError):
    """AES-GCM refused the ciphertext (its tag did not verify under this enc_key)."""


class PlaintextError(FormatError):
    """A decrypted plaintext is not a valid memory or tombstone object."""


class KeyUnwrapError(FormatError):
    """A wrapped secret could not be unwrapped (wrong secret, corrupt envelope)."""


class HandoffError(FormatError):
    """A team handoff seal could not be made or opened."""


class RecoveryPhraseError(FormatError):
    """A recovery phrase is not 12 valid BIP39 English words with a valid checksum."""


class VaultError(FormatError):
    """The local vault could not be opened or is not an Engram vault."""


class WrongPassphraseError(VaultError):
    """No known key derivation opens this vault with the given passphrase."""
