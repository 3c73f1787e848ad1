"""Team key handoff (PROTOCOL §14, shared_format.handoff)."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_sync.shared_format.b64 import b64url_encode
from engram_sync.shared_format.errors import HandoffError
from engram_sync.shared_format.handoff import (
    HandoffKeyPair,
    SealedHandoff,
    decode_public_key,
    decode_sealed,
    encode_public_key,
    encode_sealed,
    new_handoff_keypair,
    open_handoff_wire,
    open_sealed_vault_key,
    public_key_fingerprint,
    seal_vault_key,
)
from engram_sync.shared_format.wraps import pack_vault_key

VAULT = "team-acme"
K = pack_vault_key(bytes(range(32)), bytes(range(32, 64)), VAULT)
# Order of the P-256 group.
P256_N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
FINGERPRINT_RE = re.compile(r"[A-Z2-7]{4}-[A-Z2-7]{4}-[A-Z2-7]{4}-[A-Z2-7]{4}")


def _pub(priv: ec.EllipticCurvePrivateKey) -> bytes:
    return priv.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )


@pytest.fixture(scope="module")
def requester() -> HandoffKeyPair:
    return new_handoff_keypair()


@pytest.fixture(scope="module")
def sealed(requester: HandoffKeyPair) -> SealedHandoff:
    return seal_vault_key(requester.public_key, K)


def test_keypair_shape(requester: HandoffKeyPair) -> None:
    assert len(requester.public_key) == 65
    assert requester.public_key[0] == 0x04
    assert requester.public_key == _pub(requester.private_key)
    assert "private_key" not in repr(requester)


def test_round_trip(requester: HandoffKeyPair, sealed: SealedHandoff) -> None:
    assert len(sealed.admin_public_key) == 65
    assert len(sealed.sealed) == 12 + len(K) + 16
    assert open_sealed_vault_key(requester, sealed.admin_public_key, sealed.sealed) == K


def test_each_seal_uses_a_fresh_admin_key(requester: HandoffKeyPair) -> None:
    a = seal_vault_key(requester.public_key, K)
    b = seal_vault_key(requester.public_key, K)
    assert a.admin_public_key != b.admin_public_key
    assert a.sealed != b.sealed


def test_wire_round_trip(requester: HandoffKeyPair, sealed: SealedHandoff) -> None:
    # Requester posts its key, admin decodes it, seals, requester claims.
    admin_side_key = decode_public_key(requester.public_key_b64url)
    assert admin_side_key == requester.public_key
    wire = seal_vault_key(admin_side_key, K).to_wire()
    assert set(wire) == {"public_key", "sealed"}
    assert all("=" not in v and "+" not in v and "/" not in v for v in wire.values())
    vk = open_handoff_wire(requester, wire["public_key"], wire["sealed"], VAULT)
    assert (vk.enc_key + vk.hmac_key, vk.vault_id) == (K[:64], VAULT)
    again = SealedHandoff.from_wire(wire["public_key"], wire["sealed"])
    assert open_sealed_vault_key(requester, again.admin_public_key, again.sealed) == K


def test_wire_checks_vault_id_suffix(requester: HandoffKeyPair, sealed: SealedHandoff) -> None:
    wire = sealed.to_wire()
    with pytest.raises(HandoffError, match="rejected"):
        open_handoff_wire(requester, wire["public_key"], wire["sealed"], "team-other")


def test_other_requester_key_cannot_open(sealed: SealedHandoff) -> None:
    with pytest.raises(HandoffError, match="does not open"):
        open_sealed_vault_key(new_handoff_keypair(), sealed.admin_public_key, sealed.sealed)


def test_substituted_admin_key_fails(requester: HandoffKeyPair, sealed: SealedHandoff) -> None:
    with pytest.raises(HandoffError, match="does not open"):
        open_sealed_vault_key(requester, new_handoff_keypair().public_key, sealed.sealed)


def test_relay_substituting_requester_key_changes_fingerprint(
    requester: HandoffKeyPair,
) -> None:
    # A malicious relay swaps in its own key: the admin sees a different code.
    relay = new_handoff_keypair()
    assert public_key_fingerprint(relay.public_key) != requester.fingerprint
    stolen = seal_vault_key(relay.public_key, K)
    with pytest.raises(HandoffError):
        open_sealed_vault_key(requester, stolen.admin_public_key, stolen.sealed)


_FLIP_REQ = HandoffKeyPair.from_private_key(ec.derive_private_key(0xC0FFEE, ec.SECP256R1()))
_FLIP_SEAL = seal_vault_key(_FLIP_REQ.public_key, K)


@settings(max_examples=150)
@given(st.integers(min_value=0, max_value=(12 + len(K) + 16) * 8 - 1))
def test_any_flipped_bit_in_seal_is_rejected(bit: int) -> None:
    damaged = bytearray(_FLIP_SEAL.sealed)
    damaged[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(HandoffError):
        open_sealed_vault_key(_FLIP_REQ, _FLIP_SEAL.admin_public_key, bytes(damaged))


@settings(max_examples=150)
@given(st.integers(min_value=8, max_value=65 * 8 - 1))
def test_any_flipped_bit_in_admin_key_is_rejected(bit: int) -> None:
    # Byte 0 is the 0x04 prefix; any other flip gives an invalid or a different point.
    damaged = bytearray(_FLIP_SEAL.admin_public_key)
    damaged[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(HandoffError):
        open_sealed_vault_key(_FLIP_REQ, bytes(damaged), _FLIP_SEAL.sealed)


# --- fingerprint ------------------------------------------------------------------


def test_fingerprint_format_and_stability(requester: HandoffKeyPair) -> None:
    fp = public_key_fingerprint(requester.public_key)
    assert FINGERPRINT_RE.fullmatch(fp)
    assert len(fp) == 19
    assert public_key_fingerprint(requester.public_key) == fp == requester.fingerprint
    expected = base64.b32encode(hashlib.sha256(requester.public_key).digest()[:10]).decode()
    assert fp.replace("-", "") == expected


def test_fingerprint_known_value() -> None:
    # Generator G of P-256 (private scalar 1): pins the fingerprint encoding.
    g = _pub(ec.derive_private_key(1, ec.SECP256R1()))
    assert g.hex().startswith("046b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296")
    digest = hashlib.sha256(g).digest()[:10]
    code = base64.b32encode(digest).decode()
    assert public_key_fingerprint(g) == "-".join(code[i : i + 4] for i in range(0, 16, 4))
    assert public_key_fingerprint(g) == "NGF6-UY64-ISRU-IZR7"


def test_fingerprints_differ_for_different_keys() -> None:
    fps = {new_handoff_keypair().fingerprint for _ in range(20)}
    assert len(fps) == 20


def test_fingerprint_rejects_invalid_key() -> None:
    with pytest.raises(HandoffError):
        public_key_fingerprint(b"\x04" + bytes(64))


# --- known answer for the §14 seal key -----------------------------------------


def test_seal_key_known_answer_from_fixed_scalars() -> None:
    """Recompute SHA-256("engram-team-handoff-v1" ‖ X) by hand from fixed scalars.

    X is obtained without ECDH: x((d_req * d_admin mod n) * G) via derive_private_key.
    """
    curve = ec.SECP256R1()
    d_req = 0x1F2E3D4C5B6A79880123456789ABCDEF0F1E2D3C4B5A69788796A5B4C3D2E1F0
    d_admin = 0x0A1B2C3D4E5F60718293A4B5C6D7E8F90112233445566778899AABBCCDDEEFF0
    req_priv = ec.derive_private_key(d_req, curve)
    admin_priv = ec.derive_private_key(d_admin, curve)
    shared_point = _pub(ec.derive_private_key(d_req * d_admin % P256_N, curve))
    x = shared_point[1:33]
    seal_key = hashlib.sha256(b"engram-team-handoff-v1" + x).digest()
    # Cross-checked once with an independent pure-Python P-256 scalar multiplication.
    assert seal_key.hex() == "2fb4809fec6d10124625e970552ae0f351682d0f4fe3064741f0148cbc18dffd"
    requester = HandoffKeyPair.from_private_key(req_priv)

    # Admin side by hand (fixed nonce) -> the module opens it.
    nonce = bytes(range(12))
    by_hand = nonce + AESGCM(seal_key).encrypt(nonce, K, None)
    assert open_sealed_vault_key(requester, _pub(admin_priv), by_hand) == K

    # Module seals (random admin key) -> opened by hand with the same KDF.
    made = seal_vault_key(requester.public_key, K)
    x2 = req_priv.exchange(
        ec.ECDH(), ec.EllipticCurvePublicKey.from_encoded_point(curve, made.admin_public_key)
    )
    key2 = hashlib.sha256(b"engram-team-handoff-v1" + x2).digest()
    assert AESGCM(key2).decrypt(made.sealed[:12], made.sealed[12:], None) == K


# --- wire validation -------------------------------------------------------------


def test_decode_public_key_rejects_bad_input(requester: HandoffKeyPair) -> None:
    good = requester.public_key
    compressed = requester.private_key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint
    )
    off_curve = good[:-1] + bytes([good[-1] ^ 1])
    cases = [
        b64url_encode(good) + "=",  # padding
        base64.b64encode(good).decode(),  # std alphabet + padding
        b64url_encode(good)[:-1],  # truncated
        " " + b64url_encode(good),
        b64url_encode(good[:64]),  # 64 bytes
        b64url_encode(good + b"\x00"),  # 66 bytes
        b64url_encode(compressed),  # 33-byte compressed point
        b64url_encode(b"\x05" + good[1:]),  # wrong prefix
        b64url_encode(off_curve),  # not on the curve
        b64url_encode(b"\x04" + bytes(64)),
        "",
    ]
    for text in cases:
        with pytest.raises(HandoffError):
            decode_public_key(text)


def test_decode_sealed_rejects_bad_input(sealed: SealedHandoff) -> None:
    good = encode_sealed(sealed.sealed)
    assert decode_sealed(good) == sealed.sealed
    for text in [
        good + "=",
        good + "é",
        b64url_encode(sealed.sealed[:92]),  # shorter than nonce + 65-byte K + tag
        b64url_encode(bytes(513)),
        "",
    ]:
        with pytest.raises(HandoffError):
            decode_sealed(text)


def test_encoders_validate(requester: HandoffKeyPair) -> None:
    assert encode_public_key(requester.public_key) == requester.public_key_b64url
    with pytest.raises(HandoffError):
        encode_public_key(b"\x04" + bytes(64))
    with pytest.raises(HandoffError):
        encode_sealed(b"short")


def test_seal_rejects_bad_requester_key_and_bad_k(requester: HandoffKeyPair) -> None:
    with pytest.raises(HandoffError, match="65 bytes"):
        seal_vault_key(requester.public_key[:64], K)
    with pytest.raises(HandoffError, match="valid point"):
        seal_vault_key(b"\x04" + bytes(64), K)
    with pytest.raises(HandoffError):
        seal_vault_key(requester.public_key, K[:64])
    with pytest.raises(HandoffError, match="UTF-8"):
        seal_vault_key(requester.public_key, K[:64] + b"\xff")


def test_open_rejects_wrong_lengths(requester: HandoffKeyPair, sealed: SealedHandoff) -> None:
    with pytest.raises(HandoffError, match="bytes"):
        open_sealed_vault_key(requester, sealed.admin_public_key, sealed.sealed[:92])
    with pytest.raises(HandoffError, match="bytes"):
        open_sealed_vault_key(requester, sealed.admin_public_key, bytes(513))
    with pytest.raises(HandoffError, match="65 bytes"):
        open_sealed_vault_key(requester, sealed.admin_public_key[1:], sealed.sealed)


def test_from_private_key_rejects_other_curves() -> None:
    with pytest.raises(HandoffError, match="P-256"):
        HandoffKeyPair.from_private_key(ec.generate_private_key(ec.SECP384R1()))
