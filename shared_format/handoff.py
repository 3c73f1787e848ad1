"""Team key handoff: sealing K to a requester's ephemeral P-256 key (PROTOCOL §14).

Requester: :func:`new_handoff_keypair`, post ``keypair.public_key_b64url``, show
``keypair.fingerprint``; later :func:`open_sealed_vault_key` (or
:func:`open_handoff_wire`) with what the claim returns.
Admin: :func:`decode_public_key` on the request, compare
:func:`public_key_fingerprint` with the requester's screen, then
:func:`seal_vault_key` and post ``SealedHandoff.to_wire()``.

Seal construction (PROTOCOL §14)::

    X      = ECDH(admin ephemeral private, requester public)  # 32-byte x coordinate
    key    = SHA-256(b"engram-team-handoff-v1" ‖ X)
    sealed = nonce(12) ‖ AES-256-GCM(key, K)                  # no AAD

With a pairing code (PROTOCOL §14 step 4, :mod:`shared_format.handoff_pake`)
the key is also bound to the SPAKE2 exchange, so only a holder of the code's
secret part can open the seal::

    key    = SHA-256(b"engram-team-handoff-pake-v1" ‖ X ‖ binding)  # binding: 32 bytes

Every failure raises :class:`HandoffError`; no message contains key material.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .b64 import Base64Error, b64url_decode, b64url_encode
from .errors import HandoffError, KeyUnwrapError
from .wraps import MAX_K_LEN, MIN_K_LEN, VaultKey, unpack_vault_key

__all__ = [
    "HANDOFF_KDF_TAG",
    "HANDOFF_PAKE_KDF_TAG",
    "MAX_SEALED_LEN",
    "MIN_SEALED_LEN",
    "PUBLIC_KEY_LEN",
    "HandoffKeyPair",
    "SealedHandoff",
    "decode_public_key",
    "decode_sealed",
    "encode_public_key",
    "encode_sealed",
    "new_handoff_keypair",
    "open_handoff_wire",
    "open_sealed_vault_key",
    "public_key_fingerprint",
    "seal_vault_key",
]

# PROTOCOL §14 constants.
HANDOFF_KDF_TAG = b"engram-team-handoff-v1"
HANDOFF_PAKE_KDF_TAG = b"engram-team-handoff-pake-v1"  # docs/handoff.md
BINDING_LEN = 32
PUBLIC_KEY_LEN = 65  # SEC1 uncompressed: 0x04 ‖ X(32) ‖ Y(32)
_NONCE_LEN = 12
_TAG_LEN = 16
MIN_SEALED_LEN = _NONCE_LEN + MIN_K_LEN + _TAG_LEN  # 93
MAX_SEALED_LEN = _NONCE_LEN + MAX_K_LEN + _TAG_LEN  # 512, same cap as a §13 wrap
_CURVE = ec.SECP256R1()


def _load_public_key(public65: bytes) -> ec.EllipticCurvePublicKey:
    """Validate a 65-byte SEC1 uncompressed P-256 point (PROTOCOL §14)."""
    if len(public65) != PUBLIC_KEY_LEN:
        raise HandoffError(
            f"handoff public key must be {PUBLIC_KEY_LEN} bytes (SEC1 uncompressed), "
            f"got {len(public65)}"
        )
    if public65[0] != 0x04:
        raise HandoffError("handoff public key must be SEC1 uncompressed (first byte 0x04)")
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(_CURVE, bytes(public65))
    except ValueError:
        raise HandoffError("handoff public key is not a valid point on P-256") from None


def _public_bytes(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )


def _seal_key(
    private_key: ec.EllipticCurvePrivateKey,
    peer: ec.EllipticCurvePublicKey,
    binding: bytes | None,
) -> bytes:
    shared_x = private_key.exchange(ec.ECDH(), peer)
    if binding is None:
        # PROTOCOL §14: SHA-256("engram-team-handoff-v1" ‖ ECDH shared X coordinate).
        return hashlib.sha256(HANDOFF_KDF_TAG + shared_x).digest()
    # PROTOCOL §14 step 4, pairing-code path: also bound to the PAKE key (docs/handoff.md).
    if len(binding) != BINDING_LEN:
        raise HandoffError(f"a seal binding must be {BINDING_LEN} bytes")
    return hashlib.sha256(HANDOFF_PAKE_KDF_TAG + shared_x + binding).digest()


def public_key_fingerprint(public65: bytes) -> str:
    """Short human-comparable code for a handoff public key (PROTOCOL §14).

    Our choice (the spec only says "a short code derived from SHA-256 of the
    public key"): the first 10 bytes (80 bits) of SHA-256 over the 65 raw SEC1
    bytes, RFC 4648 base32 (A-Z, 2-7; 16 chars, no padding), grouped as
    ``XXXX-XXXX-XXXX-XXXX``. HandoffError if the key is not a valid P-256 point.
    """
    _load_public_key(public65)
    code = base64.b32encode(hashlib.sha256(public65).digest()[:10]).decode("ascii")
    return "-".join(code[i : i + 4] for i in range(0, 16, 4))


@dataclass(frozen=True)
class HandoffKeyPair:
    """An ephemeral P-256 key pair; ``public_key`` is the 65-byte SEC1 point."""

    private_key: ec.EllipticCurvePrivateKey = field(repr=False)
    public_key: bytes

    @classmethod
    def from_private_key(cls, private_key: ec.EllipticCurvePrivateKey) -> HandoffKeyPair:
        """Wrap an existing P-256 private key (e.g. one reloaded from disk)."""
        if not isinstance(private_key.curve, ec.SECP256R1):
            raise HandoffError("handoff keys must be on P-256")
        return cls(private_key=private_key, public_key=_public_bytes(private_key.public_key()))

    @property
    def public_key_b64url(self) -> str:
        """The public key as sent on the wire (base64url, no padding)."""
        return encode_public_key(self.public_key)

    @property
    def fingerprint(self) -> str:
        """:func:`public_key_fingerprint` of this pair's public key."""
        return public_key_fingerprint(self.public_key)


def new_handoff_keypair() -> HandoffKeyPair:
    """A fresh ephemeral P-256 key pair."""
    return HandoffKeyPair.from_private_key(ec.generate_private_key(_CURVE))


@dataclass(frozen=True)
class SealedHandoff:
    """What the admin posts to the seal route: its ephemeral public key and the seal."""

    admin_public_key: bytes
    sealed: bytes

    def to_wire(self) -> dict[str, str]:
        """``{"public_key": b64url, "sealed": b64url}`` for the seal route body."""
        return {
            "public_key": encode_public_key(self.admin_public_key),
            "sealed": encode_sealed(self.sealed),
        }

    @classmethod
    def from_wire(cls, public_key: str, sealed: str) -> SealedHandoff:
        """Decode and validate the two wire strings; HandoffError on any problem."""
        return cls(admin_public_key=decode_public_key(public_key), sealed=decode_sealed(sealed))


def seal_vault_key(
    requester_public65: bytes, k_bytes: bytes, *, binding: bytes | None = None
) -> SealedHandoff:
    """Seal K to the requester's public key with a fresh admin ephemeral pair.

    `binding` (32 bytes, from the pairing code's PAKE) binds the seal key to it too.
    """
    requester = _load_public_key(requester_public65)
    if not MIN_K_LEN <= len(k_bytes) <= MAX_K_LEN:
        raise HandoffError(f"vault key must be {MIN_K_LEN}..{MAX_K_LEN} bytes, got {len(k_bytes)}")
    try:
        unpack_vault_key(k_bytes, None)
    except KeyUnwrapError as exc:
        raise HandoffError(f"refusing to seal a malformed vault key: {exc}") from None
    admin = ec.generate_private_key(_CURVE)
    nonce = secrets.token_bytes(_NONCE_LEN)
    key = _seal_key(admin, requester, binding)
    sealed = nonce + AESGCM(key).encrypt(nonce, k_bytes, None)
    return SealedHandoff(admin_public_key=_public_bytes(admin.public_key()), sealed=sealed)


def open_sealed_vault_key(
    requester_keypair: HandoffKeyPair,
    admin_public65: bytes,
    sealed: bytes,
    *,
    binding: bytes | None = None,
) -> bytes:
    """Unseal K with the requester's private key (and `binding`, as sealed); HandoffError
    on any failure.

    Returns the raw K bytes; check its vault_id with
    :func:`shared_format.wraps.unpack_vault_key` (or use :func:`open_handoff_wire`).
    """
    admin = _load_public_key(admin_public65)
    if not MIN_SEALED_LEN <= len(sealed) <= MAX_SEALED_LEN:
        raise HandoffError(
            f"sealed vault key must be {MIN_SEALED_LEN}..{MAX_SEALED_LEN} bytes, got {len(sealed)}"
        )
    key = _seal_key(requester_keypair.private_key, admin, binding)
    try:
        return AESGCM(key).decrypt(sealed[:_NONCE_LEN], sealed[_NONCE_LEN:], None)
    except InvalidTag:
        raise HandoffError(
            "the sealed vault key does not open with this request's key "
            "(it was sealed to another key, or modified)"
        ) from None


def open_handoff_wire(
    requester_keypair: HandoffKeyPair,
    admin_public_key: str,
    sealed: str,
    expected_vault_id: str,
) -> VaultKey:
    """Decode the claim's wire strings, unseal K and check its vault_id suffix."""
    k = open_sealed_vault_key(
        requester_keypair, decode_public_key(admin_public_key), decode_sealed(sealed)
    )
    # PROTOCOL §14 step 3: the requester verifies the vault_id suffix of K.
    try:
        return unpack_vault_key(k, expected_vault_id)
    except KeyUnwrapError as exc:
        raise HandoffError(f"unsealed vault key rejected: {exc}") from None


def encode_public_key(public65: bytes) -> str:
    """base64url (no padding) of a validated 65-byte public key."""
    _load_public_key(public65)
    return b64url_encode(public65)


def decode_public_key(text: str) -> bytes:
    """Decode a wire public key; HandoffError on bad base64url, length or point."""
    try:
        raw = b64url_decode(text)
    except Base64Error as exc:
        raise HandoffError(f"handoff public_key: {exc}") from None
    _load_public_key(raw)
    return raw


def encode_sealed(sealed: bytes) -> str:
    """base64url (no padding) of a seal."""
    if not MIN_SEALED_LEN <= len(sealed) <= MAX_SEALED_LEN:
        raise HandoffError(
            f"sealed vault key must be {MIN_SEALED_LEN}..{MAX_SEALED_LEN} bytes, got {len(sealed)}"
        )
    return b64url_encode(sealed)


def decode_sealed(text: str) -> bytes:
    """Decode a wire seal; HandoffError on bad base64url or length."""
    try:
        raw = b64url_decode(text)
    except Base64Error as exc:
        raise HandoffError(f"handoff sealed: {exc}") from None
    if not MIN_SEALED_LEN <= len(raw) <= MAX_SEALED_LEN:
        raise HandoffError(
            f"sealed vault key must be {MIN_SEALED_LEN}..{MAX_SEALED_LEN} bytes, got {len(raw)}"
        )
    return raw
