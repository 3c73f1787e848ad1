"""Authenticating the team key handoff with a pairing code's secret part (PROTOCOL §14 step 4).

The relay knows the requester's ephemeral public key, so without this it could
seal a K' of its own choosing to it. With a pairing code ``ENG-XXXX-XXXX-XXXX-
SSSS-SSSS`` (shared_format.pairing) both clients know the whole code, the relay
only its first part. The whole code is the password of a SPAKE2 exchange run
through the relay's handoff mailbox (the `spake2` package, Ed25519 group, as
Magic Wormhole does it):

- requester (side B) posts ``pake`` = its SPAKE2 message with the request;
- admin (side A) finishes the exchange, seals K with a key bound to the PAKE
  key and posts its own SPAKE2 message with ``auth`` = HMAC-SHA256 over
  ``request_id ‖ requester public key ‖ admin public key ‖ sealed``;
- requester finishes the exchange, checks ``auth`` in constant time, and only
  then unseals (with the same binding) and checks K's vault id.

Key schedule (docs/handoff.md has the framing and the known-answer values)::

    pake_key = SPAKE2(password = ASCII of the normalised whole code,
                      idA = b"engram-team-handoff-v1:admin",
                      idB = b"engram-team-handoff-v1:requester")   # 32 bytes
    mac_key  = HMAC-SHA256(pake_key, b"engram-team-handoff-v1 auth")
    binding  = HMAC-SHA256(pake_key, b"engram-team-handoff-v1 seal")
    auth     = HMAC-SHA256(mac_key, lp(request_id UTF-8) ‖ lp(requester public key)
                                    ‖ lp(admin public key) ‖ lp(sealed))
    lp(x)    = u32_big_endian(len(x)) ‖ x

A relay that replaces the requester's public key or SPAKE2 message gets a seal
it cannot open unless it guessed the secret part (one online guess per
exchange: the admin's device forgets the secret after sealing once); a relay
that swaps the admin's key, the seal or the admin's message fails ``auth``.
The SPAKE2 messages reveal nothing for an offline guess. Every failure raises
HandoffError; no message contains key material.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from spake2 import SPAKE2_A, SPAKE2_B, SPAKEError
from spake2.ed25519_basic import NotOnCurve

from .b64 import Base64Error, b64url_decode, b64url_encode
from .errors import HandoffError, KeyUnwrapError
from .handoff import (
    HandoffKeyPair,
    SealedHandoff,
    decode_public_key,
    decode_sealed,
    open_sealed_vault_key,
    seal_vault_key,
)
from .pairing import PairingCode
from .wraps import VaultKey, unpack_vault_key

__all__ = [
    "AUTH_LEN",
    "PAKE_ID_ADMIN",
    "PAKE_ID_REQUESTER",
    "PAKE_MESSAGE_LEN",
    "SIDE_ADMIN",
    "SIDE_REQUESTER",
    "AuthenticatedSeal",
    "PakeKeys",
    "RequesterPake",
    "decode_auth",
    "decode_pake_message",
    "derive_pake_keys",
    "encode_auth",
    "encode_pake_message",
    "handoff_auth",
    "handoff_auth_input",
    "open_vault_key_with_code",
    "open_wire_with_code",
    "pake_password",
    "seal_vault_key_with_code",
    "verify_handoff_auth",
]

# PROTOCOL §14 step 4 constants (docs/handoff.md).
PAKE_ID_ADMIN: Final = b"engram-team-handoff-v1:admin"  # SPAKE2 side A
PAKE_ID_REQUESTER: Final = b"engram-team-handoff-v1:requester"  # SPAKE2 side B
PAKE_MESSAGE_LEN: Final = 33  # side byte (b"A" / b"B") ‖ 32-byte Ed25519 element
AUTH_LEN: Final = 32
_MAC_LABEL: Final = b"engram-team-handoff-v1 auth"
_SEAL_LABEL: Final = b"engram-team-handoff-v1 seal"
SIDE_ADMIN: Final = b"A"
SIDE_REQUESTER: Final = b"B"

Entropy = Callable[[int], bytes]


@dataclass(frozen=True)
class PakeKeys:
    """The two keys derived from one SPAKE2 exchange."""

    mac_key: bytes = field(repr=False)
    binding: bytes = field(repr=False)


def derive_pake_keys(pake_key: bytes) -> PakeKeys:
    """mac_key and the seal binding from the 32-byte SPAKE2 output."""
    if len(pake_key) != 32:
        raise HandoffError("a PAKE key is 32 bytes")
    return PakeKeys(
        mac_key=hmac.new(pake_key, _MAC_LABEL, hashlib.sha256).digest(),
        binding=hmac.new(pake_key, _SEAL_LABEL, hashlib.sha256).digest(),
    )


def pake_password(code: PairingCode) -> bytes:
    """The SPAKE2 password: ASCII of the whole normalised code (it needs a secret part)."""
    if code.secret is None:
        raise HandoffError("this pairing code has no secret part, so it cannot authenticate")
    return code.full.encode("ascii")


def _lp(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def handoff_auth_input(
    request_id: str, requester_public: bytes, admin_public: bytes, sealed: bytes
) -> bytes:
    """The HMAC input: each field length-prefixed (u32 big-endian), in this order."""
    return b"".join(
        _lp(part) for part in (request_id.encode("utf-8"), requester_public, admin_public, sealed)
    )


def handoff_auth(
    keys: PakeKeys, request_id: str, requester_public: bytes, admin_public: bytes, sealed: bytes
) -> bytes:
    """HMAC-SHA256(mac_key, request_id ‖ requester public key ‖ admin public key ‖ sealed)."""
    message = handoff_auth_input(request_id, requester_public, admin_public, sealed)
    return hmac.new(keys.mac_key, message, hashlib.sha256).digest()


def verify_handoff_auth(
    keys: PakeKeys,
    request_id: str,
    requester_public: bytes,
    admin_public: bytes,
    sealed: bytes,
    auth: bytes,
) -> None:
    """Constant-time check of `auth`; HandoffError when it does not match."""
    expected = handoff_auth(keys, request_id, requester_public, admin_public, sealed)
    if not hmac.compare_digest(expected, auth):
        raise HandoffError(
            "the seal is not authenticated by this pairing code (a mistyped secret part, "
            "or a relay that replaced a key, the seal or the exchange)"
        )


def _finish(side: SPAKE2_A | SPAKE2_B, inbound: bytes) -> PakeKeys:
    try:
        return derive_pake_keys(side.finish(inbound))
    except (SPAKEError, ValueError, NotOnCurve):
        raise HandoffError("the other side's pairing-code exchange message is invalid") from None


class RequesterPake:
    """The requester's side (SPAKE2 B): its message goes with the handoff request.

    The state (:meth:`state`, which holds the password and the secret scalar)
    must be kept as secret as K until the claim: the client keeps it in the
    encrypted vault database so a restarted command resumes the request.
    """

    def __init__(self, side: SPAKE2_B, message: bytes) -> None:
        self._side = side
        self.message = message

    @classmethod
    def start(cls, password: bytes, *, entropy: Entropy = os.urandom) -> RequesterPake:
        """A fresh exchange for `password` (:func:`pake_password`)."""
        side = SPAKE2_B(password, idA=PAKE_ID_ADMIN, idB=PAKE_ID_REQUESTER, entropy_f=entropy)
        return cls(side, side.start())

    def state(self) -> bytes:
        """Serialised state for :meth:`from_state` (secret: password and scalar inside)."""
        data: bytes = self._side.serialize()
        return data

    @classmethod
    def from_state(cls, state: bytes) -> RequesterPake:
        """Resume an exchange saved with :meth:`state`."""
        try:
            side = SPAKE2_B.from_serialized(state)
        except (SPAKEError, ValueError, KeyError, TypeError):
            raise HandoffError("the saved pairing-code exchange is unusable") from None
        if (side.idA, side.idB) != (PAKE_ID_ADMIN, PAKE_ID_REQUESTER):
            raise HandoffError("the saved pairing-code exchange is for another protocol")
        return cls(side, SIDE_REQUESTER + side.outbound_message)

    def finish(self, admin_message: bytes) -> PakeKeys:
        """The keys, from the admin's message (once; resume from the state to retry)."""
        _check_message(admin_message, SIDE_ADMIN)
        return _finish(self._side, admin_message)


@dataclass(frozen=True)
class AuthenticatedSeal:
    """What the admin posts on the pairing-code path: the seal, its SPAKE2 message, auth."""

    seal: SealedHandoff
    pake_message: bytes
    auth: bytes

    def to_wire(self) -> dict[str, str]:
        """``{"public_key", "sealed", "pake", "auth"}`` (base64url, no padding)."""
        return {
            **self.seal.to_wire(),
            "pake": encode_pake_message(self.pake_message, SIDE_ADMIN),
            "auth": encode_auth(self.auth),
        }


def seal_vault_key_with_code(
    password: bytes,
    request_id: str,
    requester_public: bytes,
    requester_message: bytes,
    k_bytes: bytes,
    *,
    entropy: Entropy = os.urandom,
) -> AuthenticatedSeal:
    """The admin's side (SPAKE2 A): finish the exchange, seal K bound to it, authenticate."""
    _check_message(requester_message, SIDE_REQUESTER)
    side = SPAKE2_A(password, idA=PAKE_ID_ADMIN, idB=PAKE_ID_REQUESTER, entropy_f=entropy)
    admin_message: bytes = side.start()
    keys = _finish(side, requester_message)
    seal = seal_vault_key(requester_public, k_bytes, binding=keys.binding)
    auth = handoff_auth(keys, request_id, requester_public, seal.admin_public_key, seal.sealed)
    return AuthenticatedSeal(seal, admin_message, auth)


def open_vault_key_with_code(
    pake: RequesterPake,
    requester_keypair: HandoffKeyPair,
    request_id: str,
    admin_public: bytes,
    sealed: bytes,
    admin_message: bytes,
    auth: bytes,
    expected_vault_id: str,
) -> VaultKey:
    """The requester's check: finish the exchange, verify `auth`, unseal, check the vault id."""
    keys = pake.finish(admin_message)
    verify_handoff_auth(keys, request_id, requester_keypair.public_key, admin_public, sealed, auth)
    k = open_sealed_vault_key(requester_keypair, admin_public, sealed, binding=keys.binding)
    # PROTOCOL §14 step 3: the requester verifies the vault_id suffix of K.
    try:
        return unpack_vault_key(k, expected_vault_id)
    except KeyUnwrapError as exc:
        raise HandoffError(f"unsealed vault key rejected: {exc}") from None


def open_wire_with_code(
    pake: RequesterPake,
    requester_keypair: HandoffKeyPair,
    request_id: str,
    wire: dict[str, str],
    expected_vault_id: str,
) -> VaultKey:
    """:func:`open_vault_key_with_code` from the claim's wire strings
    (``public_key``, ``sealed``, ``pake``, ``auth``)."""
    missing = [name for name in ("public_key", "sealed", "pake", "auth") if not wire.get(name)]
    if missing:
        raise HandoffError(
            f"the claimed seal carries no {' / '.join(missing)}: it is not authenticated by "
            "the pairing code"
        )
    return open_vault_key_with_code(
        pake,
        requester_keypair,
        request_id,
        decode_public_key(wire["public_key"]),
        decode_sealed(wire["sealed"]),
        decode_pake_message(wire["pake"], SIDE_ADMIN),
        decode_auth(wire["auth"]),
        expected_vault_id,
    )


# --- wire encodings (base64url, no padding) ------------------------------------------------


def _check_message(message: bytes, side: bytes) -> None:
    if len(message) != PAKE_MESSAGE_LEN:
        raise HandoffError(f"a pairing-code exchange message is {PAKE_MESSAGE_LEN} bytes")
    if message[:1] != side:
        who = "admin" if side == SIDE_ADMIN else "requester"
        raise HandoffError(f"a pairing-code exchange message of the {who} starts with {side!r}")


def encode_pake_message(message: bytes, side: bytes) -> str:
    """base64url of a validated SPAKE2 message of `side` (b"A" admin, b"B" requester)."""
    _check_message(message, side)
    return b64url_encode(message)


def decode_pake_message(text: str, side: bytes) -> bytes:
    """Decode a wire SPAKE2 message of `side`; HandoffError on base64url, length or side."""
    try:
        raw = b64url_decode(text)
    except Base64Error as exc:
        raise HandoffError(f"handoff pake: {exc}") from None
    _check_message(raw, side)
    return raw


def encode_auth(auth: bytes) -> str:
    """base64url of a 32-byte handoff authenticator."""
    if len(auth) != AUTH_LEN:
        raise HandoffError(f"a handoff authenticator is {AUTH_LEN} bytes")
    return b64url_encode(auth)


def decode_auth(text: str) -> bytes:
    """Decode a wire authenticator; HandoffError on base64url or length."""
    try:
        raw = b64url_decode(text)
    except Base64Error as exc:
        raise HandoffError(f"handoff auth: {exc}") from None
    if len(raw) != AUTH_LEN:
        raise HandoffError(f"a handoff authenticator is {AUTH_LEN} bytes")
    return raw
