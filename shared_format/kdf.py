"""Argon2id raw key derivation (PROTOCOL §2, §13; VAULT §2).

One helper used by every derivation of the format, so the parameters of each
call site are explicit and the library call is in one place.
"""

from __future__ import annotations

import hashlib

from argon2.low_level import Type, hash_secret_raw

ARGON2_VERSION = 0x13
KEY_LEN = 32


def argon2id(
    secret: bytes,
    salt: bytes,
    *,
    memory_kib: int,
    time_cost: int = 3,
    parallelism: int = 4,
    length: int = KEY_LEN,
) -> bytes:
    """Argon2id v0x13 raw output."""
    return hash_secret_raw(
        secret=secret,
        salt=salt,
        time_cost=time_cost,
        memory_cost=memory_kib,
        parallelism=parallelism,
        hash_len=length,
        type=Type.ID,
        version=ARGON2_VERSION,
    )


def domain_salt(tag: str) -> bytes:
    """The first 16 raw bytes of SHA-256(tag) (PROTOCOL §2, VAULT §2 fallback salt)."""
    return hashlib.sha256(tag.encode("utf-8")).digest()[:16]
