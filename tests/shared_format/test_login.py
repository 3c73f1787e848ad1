"""The login secret sent to the relay instead of the account password (shared_format.login)."""

from __future__ import annotations

import base64
import hashlib

import pytest
from argon2.low_level import Type, hash_secret_raw

from engram_sync.shared_format.login import login_salt, login_secret, normalize_email
from engram_sync.shared_format.wraps import derive_wrap_key

PASSWORD = "correct horse battery staple"
# Computed once with this module's code and pinned; the independent derivation below agrees.
GOLDEN_SALT = "d7ef4873ca8d72e7fbe8678f91f2cffc"
GOLDEN_SECRET = "RnuO3NfO_UQEfi0lA6N8kPEpzFREq4kOdFGqi9sdjq0"


def test_golden_value() -> None:
    assert login_salt("person@example.org").hex() == GOLDEN_SALT
    assert login_secret(PASSWORD, "person@example.org") == GOLDEN_SECRET


def test_independent_derivation_agrees() -> None:
    salt = hashlib.sha256(b"engram-login-v1:person@example.org").digest()[:16]
    raw = hash_secret_raw(
        PASSWORD.encode(),
        salt,
        time_cost=2,
        memory_cost=19456,
        parallelism=1,
        hash_len=32,
        type=Type.ID,
        version=0x13,
    )
    assert base64.urlsafe_b64encode(raw).decode().rstrip("=") == GOLDEN_SECRET


def test_email_is_normalised_password_is_not() -> None:
    assert normalize_email("  Person@Example.ORG\n") == "person@example.org"
    assert login_secret(PASSWORD, " Person@Example.ORG ") == GOLDEN_SECRET
    assert login_secret(PASSWORD.upper(), "person@example.org") != GOLDEN_SECRET
    assert login_secret(PASSWORD, "other@example.org") != GOLDEN_SECRET


def test_secret_reveals_neither_password_nor_wrap_key() -> None:
    secret = login_secret(PASSWORD, "person@example.org")
    assert len(secret) == 43
    assert PASSWORD not in secret
    wrap_key = derive_wrap_key(PASSWORD, login_salt("person@example.org"))
    assert base64.urlsafe_b64encode(wrap_key).decode().rstrip("=") != secret


def test_unencodable_password_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not valid Unicode"):
        login_secret("\ud800", "person@example.org")
