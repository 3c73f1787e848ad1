"""The relay's login hash (PROTOCOL §13): Argon2id m=19456 KiB, t=2, p=1.

Deliberately different from the wrap-key parameters (m=65536, t=3, p=4), so a
leaked login hash gives no wrap-key material. Hashing runs in a small pool of
worker threads (never on the event loop), which also bounds its memory. Verifying an
unknown account costs the same as a wrong password: it verifies against a
dummy hash. Nothing here logs or echoes a password.

Admission (issue 14 item 7): at most `MAX_CONCURRENT_HASHES` hashes run at once, half the
cores at most, so requests that hash nothing (sync) keep a core; at most
`MAX_WAITING_HASHES` more wait for a worker. Past that a request is answered 503 `busy`
with Retry-After at once, instead of joining a queue without bound (measured: 300
concurrent wrong sign-ins stalled a device's pull for seconds; RELIABILITY.md).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, TypeVar

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from engram_sync.relay.domain.domain_errors import BusyError

T = TypeVar("T")

LOGIN_MEMORY_KIB: Final = 19456
LOGIN_TIME_COST: Final = 2
LOGIN_PARALLELISM: Final = 1
MIN_PASSWORD_CHARS: Final = 10
MAX_PASSWORD_CHARS: Final = 1024  # bounds the hashing work per request
# 19 MiB each; half the cores (at least one, at most four) so the event loop keeps a core.
MAX_CONCURRENT_HASHES: Final = max(1, min(4, (os.cpu_count() or 2) // 2))
MAX_WAITING_HASHES: Final = 8 * MAX_CONCURRENT_HASHES
BUSY_RETRY_AFTER_S: Final = 1

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


@dataclass
class HashStats:
    """Counters of the admission gate (for tests and the benchmark)."""

    admitted: int = 0  # running or waiting for a worker now
    peak_admitted: int = 0
    running: int = 0  # hashing in a worker thread now
    peak_running: int = 0
    refused: int = 0  # answered `busy`


class _Gate:
    """Admits a hash when fewer than `capacity` are running or waiting."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.stats = HashStats()
        self._lock = threading.Lock()

    def admit(self) -> bool:
        with self._lock:
            if self.stats.admitted >= self.capacity:
                self.stats.refused += 1
                return False
            self.stats.admitted += 1
            self.stats.peak_admitted = max(self.stats.peak_admitted, self.stats.admitted)
            return True

    def release(self, _: object = None) -> None:
        with self._lock:
            self.stats.admitted -= 1

    def run(self, work: Callable[[], T]) -> T:
        """`work()` in a worker thread, counted as running."""
        with self._lock:
            self.stats.running += 1
            self.stats.peak_running = max(self.stats.peak_running, self.stats.running)
        try:
            return work()
        finally:
            with self._lock:
                self.stats.running -= 1


_GATE: Final = _Gate(MAX_CONCURRENT_HASHES + MAX_WAITING_HASHES)


def hash_stats() -> HashStats:
    """A copy of the gate's counters."""
    with _GATE._lock:
        return HashStats(**vars(_GATE.stats))


def reset_peak() -> None:
    """Start counting the peaks and `refused` afresh (tests, benchmarks)."""
    with _GATE._lock:
        _GATE.stats.peak_running = _GATE.stats.running
        _GATE.stats.peak_admitted = _GATE.stats.admitted
        _GATE.stats.refused = 0


def _busy() -> BusyError:
    return BusyError(
        "the relay is checking too many passwords at once; retry in a moment",
        BUSY_RETRY_AFTER_S,
    )


def check_capacity() -> None:
    """503 `busy` now when the pool's queue is full: lets a request that would hash
    later (sign-in, after its database lookup) give up before doing any work."""
    with _GATE._lock:
        full = _GATE.stats.admitted >= _GATE.capacity
        _GATE.stats.refused += int(full)
    if full:
        raise _busy()


async def run_in_pool(work: Callable[[], T]) -> T:
    """`work()` in the hashing pool (counted like a hash), or 503 `busy` when its queue is
    full."""
    if not _GATE.admit():
        raise _busy()
    future: Future[T] = _WORKERS.submit(_GATE.run, work)
    # Released when the work is done or cancelled before it started, not when the
    # request gives up waiting: a hash already running still holds its place.
    future.add_done_callback(_GATE.release)
    return await asyncio.wrap_future(future)


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
    return await run_in_pool(lambda: _HASHER.hash(password))


async def verify_password(stored: str | None, password: str) -> bool:
    """True only if `password` matches `stored`; `stored=None` costs the same and is False."""
    if len(password) > MAX_PASSWORD_CHARS:
        password = password[:MAX_PASSWORD_CHARS]  # same work, can never match a longer one
        stored = None
    return await run_in_pool(lambda: _verify_sync(stored, password))


def needs_rehash(stored: str) -> bool:
    """True when `stored` was made with other parameters than today's."""
    try:
        return _HASHER.check_needs_rehash(stored)
    except InvalidHashError:
        return True
