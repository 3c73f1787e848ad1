"""PROTOCOL §2 known-answer values are tests."""

from __future__ import annotations

import hashlib

import pytest

from engram_sync.shared_format.kdf import domain_salt
from engram_sync.shared_format.sync_keys import (
    ENC_TAG,
    HMAC_TAG,
    SyncKeys,
    derive_sync_keys,
    vault_id_v1,
    vault_id_v2,
)
from tests.shared_format.conftest import GOLDEN_PASSPHRASE


def test_domain_salts_are_raw_sha256_prefixes() -> None:
    assert domain_salt(ENC_TAG).hex() == "aa2b5c0dfde393da5644ce74cd3d012e"
    assert domain_salt(HMAC_TAG).hex() == "940f62b76d9c6d798cc713a2616b59b9"
    assert domain_salt(ENC_TAG) == hashlib.sha256(ENC_TAG.encode()).digest()[:16]


def test_golden_sync_keys(golden_keys: SyncKeys) -> None:
    assert golden_keys.enc_key.hex() == (
        "ebe6e9bc6f27e037fdf971a752b5cbe552adabe952347d9ed53428a8d2f6ce2b"
    )
    assert golden_keys.hmac_key.hex() == (
        "8f6eacda4edc1244b2895f03593fa450c0712bb0a55abb0946fa540c5301dd26"
    )


def test_golden_vault_ids() -> None:
    assert vault_id_v1(GOLDEN_PASSPHRASE) == (
        "f12cfc020e8f2617d25e815aac10ac29b9976567614222be954e44cbef329684"
    )
    assert vault_id_v2(GOLDEN_PASSPHRASE) == (
        "f3cdfd36920cb64e4aa8836cf44fb385c0285360fdf6ebee7f12eac5bd86e511"
    )


def test_passphrase_is_not_normalised(golden_keys: SyncKeys) -> None:
    # "é" precomposed vs decomposed are different UTF-8 bytes, hence different keys.
    composed = derive_sync_keys("caf\u00e9")
    decomposed = derive_sync_keys("cafe\u0301")
    assert composed.enc_key != decomposed.enc_key
    assert composed.enc_key != golden_keys.enc_key
    assert composed.enc_key != composed.hmac_key


def test_sync_keys_never_show_in_repr(golden_keys: SyncKeys) -> None:
    assert golden_keys.enc_key.hex() not in repr(golden_keys)
    assert "redacted" in repr(golden_keys)


def test_sync_keys_reject_wrong_lengths() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        SyncKeys(enc_key=b"x" * 31, hmac_key=b"y" * 32)
    assert SyncKeys(enc_key=b"x" * 32, hmac_key=b"y" * 32).enc_key == b"x" * 32
