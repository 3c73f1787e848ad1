"""Proof of holding the recovery phrase, for account recovery on the relay (our addition to §13).

The relay must let a person who lost the password but kept the recovery phrase
set a new password, without ever learning A, the phrase or a wrap key. So the
client proves it can open the *recovery wrap*:

- recovery wrap key ``W = Argon2id(phrase, salt_rec)`` (exactly the §13 wrap key);
- ``proof = HMAC-SHA256(W, "engram-recovery-proof-v1")`` — one-way in W, so
  showing it to the relay reveals nothing that opens ``wrapped_a_rec``;
- ``verifier = SHA-256(proof)`` — stored by the relay with the recovery wrap; a
  leaked verifier does not let anyone produce the proof (a SHA-256 preimage).

Writing the recovery wrap sends ``verifier`` (needs the current password);
``POST /auth/recover`` sends ``proof``. Both are standard base64, 32 bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from .b64 import b64encode_std
from .wraps import SALT_LEN, derive_wrap_key, unwrap_secret, wrap_secret

__all__ = [
    "RECOVERY_PROOF_TAG",
    "RecoveryWrap",
    "open_recovery_wrap",
    "recovery_proof",
    "recovery_verifier",
    "wrap_for_recovery",
]

RECOVERY_PROOF_TAG = b"engram-recovery-proof-v1"


def recovery_proof(recovery_wrap_key: bytes) -> bytes:
    """HMAC-SHA256(W, tag): what `POST /auth/recover` sends (32 bytes)."""
    if len(recovery_wrap_key) != 32:
        raise ValueError("recovery wrap key must be 32 bytes")
    return hmac.new(recovery_wrap_key, RECOVERY_PROOF_TAG, hashlib.sha256).digest()


def recovery_verifier(proof: bytes) -> bytes:
    """SHA-256(proof): what the relay stores with the recovery wrap (32 bytes)."""
    return hashlib.sha256(proof).digest()


@dataclass(frozen=True)
class RecoveryWrap:
    """A recovery wrap of A with its verifier; ``wire()`` is the PUT body (minus `password`)."""

    wrapped_a_rec: bytes
    salt_rec: bytes
    verifier: bytes = field(repr=False)

    def wire(self) -> dict[str, str]:
        """``{"wrapped_a_rec", "salt_rec", "recovery_verifier"}`` as standard base64."""
        return {
            "wrapped_a_rec": b64encode_std(self.wrapped_a_rec),
            "salt_rec": b64encode_std(self.salt_rec),
            "recovery_verifier": b64encode_std(self.verifier),
        }


def wrap_for_recovery(account_key_a: bytes, phrase: str) -> RecoveryWrap:
    """Wrap A under the (normalised) phrase with a fresh salt, and its verifier: one Argon2id."""
    salt = secrets.token_bytes(SALT_LEN)
    key = derive_wrap_key(phrase, salt)
    verifier = recovery_verifier(recovery_proof(key))
    return RecoveryWrap(wrap_secret(account_key_a, key), salt, verifier)


def open_recovery_wrap(wrapped_a_rec: bytes, salt_rec: bytes, phrase: str) -> tuple[bytes, bytes]:
    """(A, proof) from the recovery wrap and the phrase; KeyUnwrapError on a wrong phrase."""
    key = derive_wrap_key(phrase, salt_rec)
    return unwrap_secret(wrapped_a_rec, key), recovery_proof(key)
