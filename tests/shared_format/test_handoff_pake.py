"""The pairing-code authentication of the team handoff (PROTOCOL §14 step 4,
shared_format.handoff_pake, docs/handoff.md).

The known-answer values below were computed once with hmac/hashlib/spake2 directly
(not through the module) and are frozen: if one changes, the format changed.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st
from spake2 import SPAKE2_A

from engram_sync.shared_format.b64 import b64url_encode
from engram_sync.shared_format.errors import HandoffError
from engram_sync.shared_format.handoff import (
    HandoffKeyPair,
    new_handoff_keypair,
    open_sealed_vault_key,
    seal_vault_key,
)
from engram_sync.shared_format.handoff_pake import (
    PAKE_ID_ADMIN,
    PAKE_ID_REQUESTER,
    AuthenticatedSeal,
    PakeKeys,
    RequesterPake,
    decode_auth,
    decode_pake_message,
    derive_pake_keys,
    handoff_auth,
    handoff_auth_input,
    open_vault_key_with_code,
    open_wire_with_code,
    pake_password,
    seal_vault_key_with_code,
    verify_handoff_auth,
)
from engram_sync.shared_format.pairing import PairingCode, parse_pairing_code
from engram_sync.shared_format.wraps import pack_vault_key

VAULT = "team-acme"
K = pack_vault_key(bytes(range(32)), bytes(range(32, 64)), VAULT)
CODE = parse_pairing_code("ENG-7K3M-Q9XA-D2PF-ABCD-EFGH")
PASSWORD = pake_password(CODE)
REQUEST_ID = "ho_000102030405060708090a0b"
P256_N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def _pub(scalar: int) -> bytes:
    return (
        ec.derive_private_key(scalar, ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    )


def _exchange(
    password: bytes = PASSWORD, requester_password: bytes = PASSWORD
) -> tuple[HandoffKeyPair, RequesterPake, AuthenticatedSeal]:
    requester = new_handoff_keypair()
    pake = RequesterPake.start(requester_password)
    sealed = seal_vault_key_with_code(password, REQUEST_ID, requester.public_key, pake.message, K)
    return requester, pake, sealed


def _open(
    requester: HandoffKeyPair, pake: RequesterPake, made: AuthenticatedSeal, **changes: bytes
) -> bytes:
    fields = {
        "admin_public": made.seal.admin_public_key,
        "sealed": made.seal.sealed,
        "admin_message": made.pake_message,
        "auth": made.auth,
        **changes,
    }
    # Resume from the saved state each time, as the client does.
    fresh = RequesterPake.from_state(pake.state())
    key = open_vault_key_with_code(
        fresh,
        requester,
        REQUEST_ID,
        fields["admin_public"],
        fields["sealed"],
        fields["admin_message"],
        fields["auth"],
        VAULT,
    )
    return key.enc_key + key.hmac_key


# --- known answers (frozen) ----------------------------------------------------------


def test_key_schedule_known_answer() -> None:
    pake_key = bytes(range(32))
    by_hand = PakeKeys(
        hmac.new(pake_key, b"engram-team-handoff-v1 auth", hashlib.sha256).digest(),
        hmac.new(pake_key, b"engram-team-handoff-v1 seal", hashlib.sha256).digest(),
    )
    keys = derive_pake_keys(pake_key)
    assert keys == by_hand
    assert keys.mac_key.hex() == "177f0c2a3d92051a8980405af3c51136be9b919f4f076606ba741511f284fb6a"
    assert keys.binding.hex() == "0bef510b577051a5870f7b837818f9d6e1f9d89901185aa3dd7bb6c3e2a8b67b"
    assert repr(keys) == "PakeKeys()"  # never in a log


def test_handoff_auth_known_answer() -> None:
    """HMAC-SHA256(mac_key, lp(request_id) ‖ lp(requester pk) ‖ lp(admin pk) ‖ lp(sealed)),
    lp = u32 big-endian length; keys are G and 2G of P-256, sealed is bytes 0..99."""
    keys = derive_pake_keys(bytes(range(32)))
    requester_pk, admin_pk, sealed = _pub(1), _pub(2), bytes(range(100))
    framed = (
        struct.pack(">I", 27)
        + REQUEST_ID.encode()
        + struct.pack(">I", 65)
        + requester_pk
        + struct.pack(">I", 65)
        + admin_pk
        + struct.pack(">I", 100)
        + sealed
    )
    assert handoff_auth_input(REQUEST_ID, requester_pk, admin_pk, sealed) == framed
    assert (
        hashlib.sha256(framed).hexdigest()
        == "6a4f24599c27850196e7bfea4225950ca19b18f6df448a81bc417d857bc811aa"
    )
    auth = handoff_auth(keys, REQUEST_ID, requester_pk, admin_pk, sealed)
    assert auth == hmac.new(keys.mac_key, framed, hashlib.sha256).digest()
    assert auth.hex() == "6eb8dce109cfed94ba8e158bf8fd40271f6d9f203dad46932bd7a8a4a33e2514"
    verify_handoff_auth(keys, REQUEST_ID, requester_pk, admin_pk, sealed, auth)
    # The order of the fields matters: swapping the two public keys is another input.
    with pytest.raises(HandoffError, match="not authenticated"):
        verify_handoff_auth(keys, REQUEST_ID, admin_pk, requester_pk, sealed, auth)


def test_spake2_known_answer() -> None:
    """SPAKE2 (spake2 0.9, Ed25519) with our ids and password, fixed entropy on both sides:
    pins the messages and the shared key (a changed library default would change them)."""
    requester = RequesterPake.start(PASSWORD, entropy=lambda n: b"\x22" * n)
    assert requester.message.hex() == (
        "42fd6244cad1bee32c0b47932b34f915bf96dbd12b85d27b7772de0c80d13067a0"
    )
    admin = SPAKE2_A(
        b"ENG-7K3M-Q9XA-D2PF-ABCD-EFGH",
        idA=b"engram-team-handoff-v1:admin",
        idB=b"engram-team-handoff-v1:requester",
        entropy_f=lambda n: b"\x11" * n,
    )
    admin_message = admin.start()
    assert admin_message.hex() == (
        "4161fe4652eb8c0e3d16007767b3e1a4ddc85fcd0004dee71b60966263bf2df4a4"
    )
    pake_key = admin.finish(requester.message)
    assert pake_key.hex() == "4f28459f2f847db6a193ab42db0d34f8f7980ba234b3185619a1a746b35f3081"
    assert requester.finish(admin_message) == derive_pake_keys(pake_key)
    assert (PAKE_ID_ADMIN, PAKE_ID_REQUESTER) == (
        b"engram-team-handoff-v1:admin",
        b"engram-team-handoff-v1:requester",
    )
    assert PASSWORD == b"ENG-7K3M-Q9XA-D2PF-ABCD-EFGH"


def test_bound_seal_key_known_answer() -> None:
    """SHA-256("engram-team-handoff-pake-v1" ‖ X ‖ binding) from fixed scalars, by hand."""
    d_req = 0x1F2E3D4C5B6A79880123456789ABCDEF0F1E2D3C4B5A69788796A5B4C3D2E1F0
    d_admin = 0x0A1B2C3D4E5F60718293A4B5C6D7E8F90112233445566778899AABBCCDDEEFF0
    binding = derive_pake_keys(bytes(range(32))).binding
    x = _pub(d_req * d_admin % P256_N)[1:33]
    seal_key = hashlib.sha256(b"engram-team-handoff-pake-v1" + x + binding).digest()
    assert seal_key.hex() == "b798a3bf2240e76fed190955e31d7687e3af70182de499a646f23dc1e33a8ddd"
    requester = HandoffKeyPair.from_private_key(ec.derive_private_key(d_req, ec.SECP256R1()))
    nonce = bytes(range(12))
    by_hand = nonce + AESGCM(seal_key).encrypt(nonce, K, None)
    assert open_sealed_vault_key(requester, _pub(d_admin), by_hand, binding=binding) == K
    with pytest.raises(HandoffError, match="does not open"):
        open_sealed_vault_key(requester, _pub(d_admin), by_hand)  # unbound: another key


# --- the exchange ----------------------------------------------------------------------


def test_round_trip_and_resume() -> None:
    requester, pake, sealed = _exchange()
    assert _open(requester, pake, sealed) == K[:64]
    wire = sealed.to_wire()
    assert set(wire) == {"public_key", "sealed", "pake", "auth"}
    key = open_wire_with_code(
        RequesterPake.from_state(pake.state()), requester, REQUEST_ID, wire, VAULT
    )
    assert key.vault_id == VAULT
    assert decode_pake_message(wire["pake"], b"A") == sealed.pake_message
    assert decode_auth(wire["auth"]) == sealed.auth


def test_wrong_secret_part_is_refused() -> None:
    other = pake_password(parse_pairing_code("ENG-7K3M-Q9XA-D2PF-ABCD-EFGJ"))
    requester, pake, sealed = _exchange(requester_password=other)
    with pytest.raises(HandoffError, match="not authenticated"):
        _open(requester, pake, sealed)


def test_relay_sealing_its_own_k_is_refused() -> None:
    """The relay knows the requester's public key: a K' sealed to it, with any auth and a
    SPAKE2 message of its own (a guessed password), does not pass."""
    requester, pake, honest = _exchange()
    k_prime = pack_vault_key(bytes(32), bytes(32), VAULT)
    guess = pake_password(parse_pairing_code("ENG-7K3M-Q9XA-D2PF-0000-0000"))
    forged = seal_vault_key_with_code(
        guess, REQUEST_ID, requester.public_key, pake.message, k_prime
    )
    with pytest.raises(HandoffError, match="not authenticated"):
        _open(requester, pake, forged)
    plain = seal_vault_key(requester.public_key, k_prime)  # the §14 seal without binding
    with pytest.raises(HandoffError, match="not authenticated"):
        _open(requester, pake, honest, admin_public=plain.admin_public_key, sealed=plain.sealed)


def test_swapped_admin_key_seal_or_message_is_refused() -> None:
    requester, pake, sealed = _exchange()
    with pytest.raises(HandoffError, match="not authenticated"):
        _open(requester, pake, sealed, admin_public=new_handoff_keypair().public_key)
    other = seal_vault_key_with_code(PASSWORD, REQUEST_ID, requester.public_key, pake.message, K)
    with pytest.raises(HandoffError, match="not authenticated"):
        _open(requester, pake, sealed, admin_message=other.pake_message)
    with pytest.raises(HandoffError, match="not authenticated"):
        _open(requester, pake, sealed, auth=bytes(32))
    with pytest.raises(HandoffError, match="not authenticated"):
        # Another request's (valid) seal replayed under this request id.
        _open(requester, pake, other, auth=handoff_auth(
            derive_pake_keys(bytes(32)), REQUEST_ID, requester.public_key,
            other.seal.admin_public_key, other.seal.sealed,
        ))  # fmt: skip


def test_relay_replacing_the_requester_cannot_open_the_seal() -> None:
    """The relay swaps in its own public key and SPAKE2 message (a guessed password): the
    admin's seal is bound to a PAKE key the relay does not have."""
    attacker = new_handoff_keypair()
    guess = pake_password(parse_pairing_code("ENG-7K3M-Q9XA-D2PF-0000-0000"))
    attacker_pake = RequesterPake.start(guess)
    sealed = seal_vault_key_with_code(
        PASSWORD, REQUEST_ID, attacker.public_key, attacker_pake.message, K
    )
    keys = attacker_pake.finish(sealed.pake_message)
    with pytest.raises(HandoffError, match="does not open"):
        open_sealed_vault_key(
            attacker, sealed.seal.admin_public_key, sealed.seal.sealed, binding=keys.binding
        )
    with pytest.raises(HandoffError, match="does not open"):
        open_sealed_vault_key(attacker, sealed.seal.admin_public_key, sealed.seal.sealed)


def test_only_the_right_request_id_verifies() -> None:
    requester, pake, sealed = _exchange()
    fresh = RequesterPake.from_state(pake.state())
    with pytest.raises(HandoffError, match="not authenticated"):
        open_vault_key_with_code(
            fresh, requester, "ho_other", sealed.seal.admin_public_key, sealed.seal.sealed,
            sealed.pake_message, sealed.auth, VAULT,
        )  # fmt: skip


def test_vault_id_is_still_checked() -> None:
    requester, pake, sealed = _exchange()
    fresh = RequesterPake.from_state(pake.state())
    with pytest.raises(HandoffError, match="rejected"):
        open_vault_key_with_code(
            fresh, requester, REQUEST_ID, sealed.seal.admin_public_key, sealed.seal.sealed,
            sealed.pake_message, sealed.auth, "team-other",
        )  # fmt: skip


_REQ = HandoffKeyPair.from_private_key(ec.derive_private_key(0xC0FFEE, ec.SECP256R1()))
_PAKE = RequesterPake.start(PASSWORD)
_SEALED = seal_vault_key_with_code(PASSWORD, REQUEST_ID, _REQ.public_key, _PAKE.message, K)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=(12 + len(K) + 16) * 8 - 1))
def test_any_flipped_bit_in_the_seal_is_refused(bit: int) -> None:
    damaged = bytearray(_SEALED.seal.sealed)
    damaged[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(HandoffError, match="not authenticated"):
        _open(_REQ, _PAKE, _SEALED, sealed=bytes(damaged))


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=8, max_value=33 * 8 - 1))
def test_any_flipped_bit_in_the_admin_message_is_refused(bit: int) -> None:
    damaged = bytearray(_SEALED.pake_message)
    damaged[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(HandoffError, match=r"not authenticated|invalid"):
        _open(_REQ, _PAKE, _SEALED, admin_message=bytes(damaged))


# --- validation ------------------------------------------------------------------------


def test_message_and_auth_decoding_is_strict() -> None:
    good = b64url_encode(_PAKE.message)
    assert decode_pake_message(good, b"B") == _PAKE.message
    for text, side in [
        (good, b"A"),  # a requester's message where the admin's is expected
        (good + "=", b"B"),
        (b64url_encode(_PAKE.message[:32]), b"B"),
        (b64url_encode(_PAKE.message + b"\x00"), b"B"),
        ("", b"B"),
    ]:
        with pytest.raises(HandoffError):
            decode_pake_message(text, side)
    for text in [b64url_encode(bytes(31)), b64url_encode(bytes(33)), "*", ""]:
        with pytest.raises(HandoffError):
            decode_auth(text)


def test_invalid_points_and_reflection_are_refused() -> None:
    requester = new_handoff_keypair()
    for message in [b"B" + bytes(32), b"B" + b"\xff" * 32, b"B" + b"\x01" + bytes(31)]:
        with pytest.raises(HandoffError, match="invalid"):
            seal_vault_key_with_code(PASSWORD, REQUEST_ID, requester.public_key, message, K)
    pake = RequesterPake.start(PASSWORD)
    with pytest.raises(HandoffError):
        pake.finish(b"A" + pake.message[1:])  # its own message reflected back


def test_a_code_without_secret_part_cannot_be_a_password() -> None:
    with pytest.raises(HandoffError, match="no secret part"):
        pake_password(PairingCode("ENG-7K3M-Q9XA-D2PF"))


def test_wire_without_authentication_is_refused() -> None:
    requester, pake, sealed = _exchange()
    wire = sealed.to_wire()
    for missing in ("pake", "auth"):
        stripped = {k: v for k, v in wire.items() if k != missing}
        with pytest.raises(HandoffError, match="not authenticated by the pairing code"):
            open_wire_with_code(RequesterPake.from_state(pake.state()), requester, REQUEST_ID,
                                stripped, VAULT)  # fmt: skip


def test_saved_state_must_be_ours() -> None:
    with pytest.raises(HandoffError, match="unusable"):
        RequesterPake.from_state(b"not json")
    from spake2 import SPAKE2_B

    other = SPAKE2_B(PASSWORD, idA=b"x", idB=b"y")
    other.start()
    with pytest.raises(HandoffError, match="another protocol"):
        RequesterPake.from_state(other.serialize())
