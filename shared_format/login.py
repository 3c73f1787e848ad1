"""The login secret a client sends instead of the account password (our addition to §13).

PROTOCOL §13 lets the relay check a `password` on sign-up, sign-in and every wrap
write, and is silent on what that text is. If it were the account password
itself, a modified relay could keep it and derive the wrap key of ``wrapped_a``:
the same password wraps A. So our client never sends the password. It sends

    login_secret = base64url-no-padding(Argon2id(UTF-8 password,
                        salt = SHA-256("engram-login-v1:" + normalised email)[0:16],
                        m=19456 KiB, t=2, p=1, 32 bytes))

everywhere the relay wants a `password` (`/auth/signup`, `/auth/signin`, the
current-password confirmation of wrap writes and deletes, `new_password` of a
password change or a recovery). The relay treats it as an opaque password and
stores only its own salted Argon2id hash of it. The raw password only ever
feeds :func:`shared_format.wraps.wrap_with_secret` and ``unwrap_with_secret``
on the device. The salt depends only on the email, so any device can compute
the secret before it has talked to the relay; a relay that keeps the secret
learns nothing that opens a wrap (a one-way function of the password with a
different salt). Normalised email = stripped and lowercased, as the relay
spells it. The password itself is not normalised (its raw UTF-8 bytes).
"""

from __future__ import annotations

import hashlib
from typing import Final

from .b64 import b64url_encode
from .kdf import argon2id

__all__ = [
    "LOGIN_MEMORY_KIB",
    "LOGIN_PARALLELISM",
    "LOGIN_SALT_TAG",
    "LOGIN_TIME_COST",
    "login_salt",
    "login_secret",
    "normalize_email",
]

LOGIN_SALT_TAG: Final = "engram-login-v1:"
LOGIN_MEMORY_KIB: Final = 19456
LOGIN_TIME_COST: Final = 2
LOGIN_PARALLELISM: Final = 1


def normalize_email(email: str) -> str:
    """The email as the relay keys accounts by it: stripped, lowercased."""
    return email.strip().lower()


def login_salt(email: str) -> bytes:
    """SHA-256("engram-login-v1:" + normalised email)[0:16]."""
    tag = LOGIN_SALT_TAG + normalize_email(email)
    return hashlib.sha256(tag.encode("utf-8")).digest()[:16]


def login_secret(password: str, email: str) -> str:
    """What the relay gets as `password`: 43 base64url characters, never the password.

    ValueError if the password cannot be encoded as UTF-8 (lone surrogates).
    """
    try:
        secret = password.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the password is not valid Unicode text") from None
    derived = argon2id(
        secret,
        login_salt(email),
        memory_kib=LOGIN_MEMORY_KIB,
        time_cost=LOGIN_TIME_COST,
        parallelism=LOGIN_PARALLELISM,
    )
    return b64url_encode(derived)
