"""Account-layer key wraps (PROTOCOL §13, shared_format.wraps)."""

from __future__ import annotations

import secrets

import pytest
from argon2.low_level import Type, hash_secret_raw
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given
from hypothesis import strategies as st

from engram_sync.shared_format.errors import KeyUnwrapError
from engram_sync.shared_format.wraps import (
    MAX_K_LEN,
    MAX_WRAP_LEN,
    WRAP_ENVELOPE_LEN,
    VaultKey,
    derive_wrap_key,
    new_account_key,
    pack_vault_key,
    unpack_vault_key,
    unwrap_secret,
    unwrap_vault_key,
    unwrap_with_secret,
    wrap_secret,
    wrap_vault_key,
    wrap_with_secret,
)

PASSWORD = "correct-horse-battery-staple ünïcode"
SALT = bytes(range(16))
# Fixed keys for the AES layer, so hypothesis never runs Argon2id.
FIXED_WRAP_KEY = bytes.fromhex("11" * 32)
FIXED_A = bytes.fromhex("a5" * 32)
ENC = bytes(range(32))
HMAC = bytes(range(32, 64))


@pytest.fixture(scope="module")
def wrap_key() -> bytes:
    return derive_wrap_key(PASSWORD, SALT)


@pytest.fixture(scope="module")
def password_wrap() -> tuple[bytes, bytes, bytes]:
    a = new_account_key()
    envelope, salt = wrap_with_secret(a, PASSWORD)
    return a, envelope, salt


# --- derivation -------------------------------------------------------------


def test_derive_wrap_key_matches_argon2id_parameters(wrap_key: bytes) -> None:
    expected = hash_secret_raw(
        secret=PASSWORD.encode("utf-8"),
        salt=SALT,
        time_cost=3,
        memory_cost=65536,
        parallelism=4,
        hash_len=32,
        type=Type.ID,
        version=0x13,
    )
    assert wrap_key == expected
    assert len(wrap_key) == 32


@pytest.mark.parametrize("salt", [b"", b"x" * 8, b"x" * 15, b"x" * 65])
def test_derive_wrap_key_rejects_bad_salt_length(salt: bytes) -> None:
    with pytest.raises(KeyUnwrapError, match="salt"):
        derive_wrap_key(PASSWORD, salt)


def test_derive_wrap_key_rejects_unencodable_secret() -> None:
    with pytest.raises(KeyUnwrapError) as info:
        derive_wrap_key("pass\ud800word", SALT)
    assert "pass" not in str(info.value)


# --- A under a wrap key -------------------------------------------------------


def test_new_account_key() -> None:
    a, b = new_account_key(), new_account_key()
    assert len(a) == 32
    assert a != b


@given(st.binary(min_size=32, max_size=32))
def test_wrap_secret_round_trip(secret32: bytes) -> None:
    envelope = wrap_secret(secret32, FIXED_WRAP_KEY)
    assert len(envelope) == WRAP_ENVELOPE_LEN == 60
    assert unwrap_secret(envelope, FIXED_WRAP_KEY) == secret32


def test_wrap_secret_uses_fresh_nonce() -> None:
    assert wrap_secret(FIXED_A, FIXED_WRAP_KEY) != wrap_secret(FIXED_A, FIXED_WRAP_KEY)


def test_wrap_secret_layout_is_nonce_then_aesgcm() -> None:
    envelope = wrap_secret(FIXED_A, FIXED_WRAP_KEY)
    assert AESGCM(FIXED_WRAP_KEY).decrypt(envelope[:12], envelope[12:], None) == FIXED_A


_ENVELOPE = wrap_secret(FIXED_A, FIXED_WRAP_KEY)


@given(st.integers(min_value=0, max_value=WRAP_ENVELOPE_LEN * 8 - 1))
def test_wrap_secret_any_flipped_bit_is_rejected(bit: int) -> None:
    damaged = bytearray(_ENVELOPE)
    damaged[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(KeyUnwrapError):
        unwrap_secret(bytes(damaged), FIXED_WRAP_KEY)


@pytest.mark.parametrize("length", [0, 12, 28, 59, 61, 92])
def test_unwrap_secret_wrong_length(length: int) -> None:
    with pytest.raises(KeyUnwrapError, match="60 bytes"):
        unwrap_secret((_ENVELOPE * 2)[:length], FIXED_WRAP_KEY)


def test_unwrap_secret_wrong_key() -> None:
    with pytest.raises(KeyUnwrapError):
        unwrap_secret(_ENVELOPE, bytes(32))


def test_unwrap_secret_bad_key_length_is_typed() -> None:
    with pytest.raises(KeyUnwrapError):
        unwrap_secret(_ENVELOPE, b"short")


@pytest.mark.parametrize("length", [0, 16, 31, 33, 64])
def test_wrap_secret_refuses_wrong_secret_length(length: int) -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        wrap_secret(b"s" * length, FIXED_WRAP_KEY)


def test_unwrap_with_derived_key_fixture(wrap_key: bytes) -> None:
    envelope = wrap_secret(FIXED_A, wrap_key)
    assert unwrap_secret(envelope, wrap_key) == FIXED_A


# --- password convenience (Argon2id: keep the count small) --------------------


def test_wrap_with_secret_round_trip(password_wrap: tuple[bytes, bytes, bytes]) -> None:
    a, envelope, salt = password_wrap
    assert len(envelope) == 60
    assert len(salt) == 16
    assert unwrap_with_secret(envelope, salt, PASSWORD) == a


def test_wrong_password_is_rejected(password_wrap: tuple[bytes, bytes, bytes]) -> None:
    _, envelope, salt = password_wrap
    with pytest.raises(KeyUnwrapError) as info:
        unwrap_with_secret(envelope, salt, PASSWORD + "x")
    assert PASSWORD not in str(info.value)


def test_unwrap_with_secret_checks_length_first(
    password_wrap: tuple[bytes, bytes, bytes],
) -> None:
    _, envelope, salt = password_wrap
    with pytest.raises(KeyUnwrapError, match="60 bytes"):
        unwrap_with_secret(envelope[:-1], salt, PASSWORD)


# --- K (vault key) --------------------------------------------------------------


def test_pack_unpack_vault_key() -> None:
    k = pack_vault_key(ENC, HMAC, "team-acmé")
    assert k == ENC + HMAC + "team-acmé".encode()
    vk = unpack_vault_key(k, "team-acmé")
    assert vk == VaultKey(enc_key=ENC, hmac_key=HMAC, vault_id="team-acmé")
    assert unpack_vault_key(k, None) == vk


def test_vault_key_repr_hides_keys() -> None:
    text = repr(unpack_vault_key(pack_vault_key(ENC, HMAC, "v"), "v"))
    assert ENC.hex() not in text
    assert repr(ENC) not in text
    assert "enc_key" not in text


@pytest.mark.parametrize(
    ("enc", "hmac", "vault_id"),
    [
        (ENC[:31], HMAC, "v"),
        (ENC, HMAC + b"x", "v"),
        (ENC, HMAC, ""),
        (ENC, HMAC, "v" * (MAX_K_LEN - 63)),
    ],
)
def test_pack_vault_key_rejects_bad_input(enc: bytes, hmac: bytes, vault_id: str) -> None:
    with pytest.raises(ValueError):
        pack_vault_key(enc, hmac, vault_id)


def test_pack_vault_key_at_the_cap() -> None:
    k = pack_vault_key(ENC, HMAC, "v" * (MAX_K_LEN - 64))
    envelope = wrap_vault_key(k, FIXED_A)
    assert len(envelope) == MAX_WRAP_LEN
    assert unwrap_vault_key(envelope, FIXED_A, "v" * (MAX_K_LEN - 64)).vault_id.startswith("v")


@pytest.mark.parametrize("k", [b"", ENC + HMAC, (ENC + HMAC)[:40]])
def test_unpack_vault_key_too_short(k: bytes) -> None:
    with pytest.raises(KeyUnwrapError, match="at least 65 bytes"):
        unpack_vault_key(k, None)


def test_unpack_vault_key_non_utf8_suffix() -> None:
    with pytest.raises(KeyUnwrapError, match="UTF-8"):
        unpack_vault_key(ENC + HMAC + b"\xff\xfe", None)


def test_unpack_vault_key_suffix_mismatch() -> None:
    k = pack_vault_key(ENC, HMAC, "vault-a")
    with pytest.raises(KeyUnwrapError, match="vault-a"):
        unpack_vault_key(k, "vault-b")


@given(
    st.binary(min_size=32, max_size=32),
    st.binary(min_size=32, max_size=32),
    st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=100),
)
def test_vault_key_wrap_round_trip(enc: bytes, hmac: bytes, vault_id: str) -> None:
    k = pack_vault_key(enc, hmac, vault_id)
    envelope = wrap_vault_key(k, FIXED_A)
    assert len(envelope) == 12 + len(k) + 16
    assert unwrap_vault_key(envelope, FIXED_A, vault_id) == VaultKey(enc, hmac, vault_id)


_K = pack_vault_key(ENC, HMAC, "f3cdfd36920cb64e4aa8836cf44fb385c0285360fdf6ebee7f12eac5bd86e511")
_K_ENVELOPE = wrap_vault_key(_K, FIXED_A)


@given(st.integers(min_value=0, max_value=len(_K_ENVELOPE) * 8 - 1))
def test_vault_key_wrap_any_flipped_bit_is_rejected(bit: int) -> None:
    damaged = bytearray(_K_ENVELOPE)
    damaged[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(KeyUnwrapError):
        unwrap_vault_key(bytes(damaged), FIXED_A, _K[64:].decode())


def test_vault_key_wrong_account_key() -> None:
    with pytest.raises(KeyUnwrapError):
        unwrap_vault_key(_K_ENVELOPE, new_account_key(), _K[64:].decode())


def test_vault_key_suffix_mismatch_after_unwrap() -> None:
    with pytest.raises(KeyUnwrapError, match="not to 'other-vault'"):
        unwrap_vault_key(_K_ENVELOPE, FIXED_A, "other-vault")


@pytest.mark.parametrize("length", [0, 60, 92, 513])
def test_vault_key_envelope_length_bounds(length: int) -> None:
    with pytest.raises(KeyUnwrapError, match="bytes"):
        unwrap_vault_key((_K_ENVELOPE * 6)[:length], FIXED_A, "v")


def test_wrap_vault_key_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        wrap_vault_key(ENC + HMAC, FIXED_A)  # no vault_id
    with pytest.raises(ValueError):
        wrap_vault_key(ENC + HMAC + b"\xff", FIXED_A)
    with pytest.raises(ValueError):
        wrap_vault_key(ENC + HMAC + b"v" * (MAX_K_LEN - 63), FIXED_A)
    with pytest.raises(ValueError):
        wrap_vault_key(_K, FIXED_A[:16])


def test_account_key_wrap_and_vault_key_wrap_compose(wrap_key: bytes) -> None:
    # The §13 chain: password -> wrap key -> A -> K.
    a = new_account_key()
    wrapped_a = wrap_secret(a, wrap_key)
    wrapped_k = wrap_vault_key(_K, a)
    recovered_a = unwrap_secret(wrapped_a, wrap_key)
    vk = unwrap_vault_key(wrapped_k, recovered_a, _K[64:].decode())
    assert (vk.enc_key, vk.hmac_key) == (ENC, HMAC)
    # The K envelope is not a 60-byte A envelope and vice versa.
    with pytest.raises(KeyUnwrapError):
        unwrap_secret(wrapped_k, a)
    assert secrets.compare_digest(recovered_a, a)
