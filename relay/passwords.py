"""The relay's login hash (PROTOCOL §13): Argon2id m=19456 KiB, t=2, p=1.

Deliberately different from the wrap-key parameters (m=65536, t=3, p=4), so a
leaked login hash gives no wrap-key material. Hashing runs in a small pool of
worker threads (never on the event loop), which also bounds its memory. Verifying an
unknown account costs the same as a wrong password: it verifies against a
dummy hash. Nothing here logs or echoes a password.
"""

from __future__ import annotations

import asyncio
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

LOGIN_MEMORY_KIB: Final = 19456
LOGIN_TIME_COST: Final = 2
LOGIN_PARALLELISM: Final = 1
MIN_PASSWORD_CHARS: Final = 10
MAX_PASSWORD_CHARS: Final = 1024  # bounds the hashing work per request
MAX_CONCURRENT_HASHES: Final = 4  # 19 MiB each

_HASHER: Final = PasswordHasher(
    time_cost=LOGIN_TIME_COST,
    memory_cost=LOGIN_MEMORY_KIB,
    parallelism=LOGIN_PARALLELISM,
    hash_len=32,
    salt_len=16,
    type=Type.ID,
)


# Its own small pool: bounds concurrent hashing (memory) and never starves other threads.
_WORKERS: Final = ThreadPoolExecutor(MAX_CONCURRENT_HASHES, thread_name_prefix="login-hash")
# A hash of a random password nobody knows, verified for unknown accounts.
_DUMMY_HASH: Final = _HASHER.hash(secrets.token_urlsafe(32))


def password_problem(password: str) -> str | None:
    """Why a new password is refused (too short or too long), or None."""
    if len(password) < MIN_PASSWORD_CHARS:
        return f"password must be at least {MIN_PASSWORD_CHARS} characters"
    if len(password) > MAX_PASSWORD_CHARS:
        return f"password must be at most {MAX_PASSWORD_CHARS} characters"
    return None


def _verify_sync(stored: str | None, password: str) -> bool:
    try:
        return _HASHER.verify(stored or _DUMMY_HASH, password) and stored is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


async def hash_password(password: str) -> str:
    """The PHC string of a new login hash (in a worker thread)."""
    return await asyncio.get_running_loop().run_in_executor(_WORKERS, _HASHER.hash, password)


async def verify_password(stored: str | None, password: str) -> bool:
    """True only if `password` matches `stored`; `stored=None` costs the same and is False."""
    if len(password) > MAX_PASSWORD_CHARS:
        password = password[:MAX_PASSWORD_CHARS]  # same work, can never match a longer one
        stored = None
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_WORKERS, _verify_sync, stored, password)


def needs_rehash(stored: str) -> bool:
    """True when `stored` was made with other parameters than today's."""
    try:
        return _HASHER.check_needs_rehash(stored)
    except InvalidHashError:
        return True
