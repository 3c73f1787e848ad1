"""Test-only: Argon2id raw derivations memoised on disk, for the test run's processes.

Most of a CLI test's time went into deriving the same keys again (the same passphrase,
the same salts, in every `engram-sync` process: 183 derivations, 42% of two e2e modules'
time). tests/conftest.py installs this memo in the pytest process and puts this folder on
the children's PYTHONPATH with `ENGRAM_TEST_ARGON2_MEMO` naming the memo's folder, so
every process the tests start loads it as its `sitecustomize`.

The derivations stay real: each distinct input (secret, salt, every parameter) is
computed once by argon2-cffi with the format's own parameters, and its output is read
back from the memo afterwards; nothing about the parameters changes, so the known-answer
tests and vaults written under the memo are byte-identical to those written without it.
The relay's password hashing (`argon2.PasswordHasher`) is not touched: its cost is what
the sign-in bounds are about. Nothing of this ships: tests/ is not in the wheel, and the
wheel tests (tests/test_distribution.py) drop PYTHONPATH.
"""

from __future__ import annotations  # no `typing` import: tests/client/cli/test_cli_imports.py

import hashlib
import os
from pathlib import Path

ENV = "ENGRAM_TEST_ARGON2_MEMO"


def install(directory: Path) -> None:
    """Wrap `argon2.low_level.hash_secret_raw` with the memo in `directory` (idempotent)."""
    try:
        import argon2.low_level as low
    except ImportError:  # a child without argon2-cffi: nothing to memoise
        return
    real = low.hash_secret_raw
    if getattr(real, "memo_directory", None) is not None:
        return

    def memoised(
        secret: bytes,
        salt: bytes,
        time_cost: int,
        memory_cost: int,
        parallelism: int,
        hash_len: int,
        type: object,
        version: int = 19,
    ) -> bytes:
        inputs = (bytes(secret), bytes(salt), time_cost, memory_cost, parallelism, hash_len)
        name = hashlib.sha256(
            repr((*inputs, getattr(type, "value", type), version)).encode()
        ).hexdigest()
        path = directory / name
        try:
            kept = path.read_bytes()
        except FileNotFoundError:
            kept = b""
        if len(kept) == hash_len:
            return kept
        derived: bytes = real(
            secret=secret, salt=salt, time_cost=time_cost, memory_cost=memory_cost,
            parallelism=parallelism, hash_len=hash_len, type=type, version=version,
        )  # fmt: skip
        partial = directory / f"{name}.{os.getpid()}.partial"
        partial.write_bytes(derived)
        os.replace(partial, path)  # whole or absent: processes share the folder
        return derived

    memoised.memo_directory = directory  # type: ignore[attr-defined]
    low.hash_secret_raw = memoised


if os.environ.get(ENV):
    install(Path(os.environ[ENV]))
