"""The test run's Argon2id memo (tests/site/sitecustomize.py): real outputs, computed once,
shared with the processes the tests start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import argon2.low_level
from argon2.low_level import Type

from engram_sync.shared_format import kdf

MEMO_ENV = "ENGRAM_TEST_ARGON2_MEMO"


def _real(secret: bytes, salt: bytes, memory_kib: int) -> bytes:
    """The derivation without the memo: the wrapped function, reached through its closure."""
    memoised = argon2.low_level.hash_secret_raw
    assert memoised.__name__ == "memoised"  # installed by tests/conftest.py
    [real] = [c.cell_contents for c in memoised.__closure__ or () if callable(c.cell_contents)]
    return bytes(real(secret=secret, salt=salt, time_cost=3, memory_cost=memory_kib,
                      parallelism=4, hash_len=32, type=Type.ID, version=19))  # fmt: skip


def _holds(path: Path, value: bytes) -> bool:
    try:
        return path.read_bytes() == value
    except FileNotFoundError:  # another worker's partial file, renamed meanwhile
        return False


def test_the_memo_gives_the_real_output_and_keeps_it_on_disk() -> None:
    directory = Path(os.environ[MEMO_ENV])
    secret, salt = os.urandom(16), os.urandom(16)  # an input no other test derived
    before = set(directory.iterdir())
    first = kdf.argon2id(secret, salt, memory_kib=1024)
    # the files added that hold this output: other xdist workers share the folder and add
    # theirs meanwhile (a fresh-clone CI run once saw two new files here)
    kept = {p for p in set(directory.iterdir()) - before if _holds(p, first)}
    assert len(kept) == 1
    [path] = kept
    assert path.read_bytes() == first == _real(secret, salt, 1024)
    assert kdf.argon2id(secret, salt, memory_kib=1024) == first  # read back
    assert kdf.argon2id(secret, salt, memory_kib=2048) != first  # every parameter is in the key


def test_a_process_the_tests_start_uses_the_same_memo() -> None:
    secret, salt = os.urandom(16), os.urandom(16)
    expected = kdf.argon2id(secret, salt, memory_kib=1024)
    directory = Path(os.environ[MEMO_ENV])
    for path in directory.iterdir():  # the child can only find it by deriving, then
        if path.read_bytes() == expected:
            path.write_bytes(b"\0" * 32)  # a kept value the child must return as kept
    script = (
        "import sys, argon2.low_level as low;"
        "from engram_sync.shared_format import kdf;"
        "print(low.hash_secret_raw.__name__, kdf.argon2id(bytes.fromhex(sys.argv[1]),"
        " bytes.fromhex(sys.argv[2]), memory_kib=1024).hex())"
    )
    child = subprocess.run(
        [sys.executable, "-c", script, secret.hex(), salt.hex()],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert child.stdout.split() == ["memoised", "00" * 32]
