"""Client end to end: M memories added on device A (SQLCipher), encrypted and pushed by A,
pulled, verified, decrypted and applied by B, through the relay, with the real client."""

from __future__ import annotations

import cProfile
import pstats
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from bench.corpus import project, sentence, tags
from bench.relay_load import BenchError
from engram_sync.client._session import VaultSession
from engram_sync.client._sync.engine import SyncReport
from engram_sync.client._vault import store as local_store

ROOT: Final = Path(__file__).resolve().parents[1]
PASSPHRASE: Final = "engram bench passphrase: correct horse battery staple"  # noqa: S105
ADD_CHUNK: Final = 1000  # memories per local transaction while filling device A
T = TypeVar("T")


@dataclass
class E2EResult:
    """Seconds of each step of one end-to-end run."""

    memories: int
    open_a_s: float  # create vault A (its Argon2id vault key included)
    open_b_s: float
    keys_a_s: float  # sync key derivation (Argon2id, PROTOCOL §2), once per process
    keys_b_s: float
    add_s: float
    push_s: float  # A: sync() = (empty) pull + encrypt + push, keys already derived
    pull_s: float  # B: sync() = pull + verify + decrypt + apply, keys already derived


def _timed(work: Callable[[], T]) -> tuple[T, float]:
    started = time.perf_counter()
    result = work()
    return result, time.perf_counter() - started


def _sync(session: VaultSession, profile: cProfile.Profile | None) -> tuple[SyncReport, float]:
    with session.relay() as relay:
        syncer = session.syncer(relay)
        if profile is not None:
            profile.enable()
        started = time.perf_counter()
        try:
            report = syncer.sync()
        finally:
            elapsed = time.perf_counter() - started
            if profile is not None:
                profile.disable()
        return report, elapsed


def run(
    base: Path,
    relay_url: str,
    key: str,
    vault_id: str,
    memories: int,
    *,
    seed: int = 11,
    profiles: tuple[cProfile.Profile, cProfile.Profile] | None = None,
) -> E2EResult:
    """One run in fresh vault directories under `base` (removed afterwards)."""
    dir_a, dir_b = base / f"{vault_id}-a", base / f"{vault_id}-b"
    rng = random.Random(seed)  # noqa: S311 - test data, not crypto
    try:
        a, open_a = _timed(lambda: VaultSession.open(dir_a, PASSPHRASE, create=True))
        with a:
            a.link(relay_url, key, vault_id, "bench-a")
            started = time.perf_counter()
            for first in range(0, memories, ADD_CHUNK):
                with a.vault.transaction() as conn:
                    for _ in range(first, min(first + ADD_CHUNK, memories)):
                        local_store.add_memory(
                            conn, sentence(rng), tags=tags(rng), project=project(rng)
                        )
            add_s = time.perf_counter() - started
            _, keys_a = _timed(lambda: a.keys)
            pushed, push_s = _sync(a, profiles[0] if profiles else None)
            if pushed.pushed != memories or pushed.rejected or pushed.oversized:
                raise BenchError(f"device A pushed {pushed.pushed} of {memories}: {pushed}")
            sample = {m.id: m.content for m in local_store.list_memories(a.vault.conn)[:50]}
        b, open_b = _timed(lambda: VaultSession.open(dir_b, PASSPHRASE, create=True))
        with b:
            b.link(relay_url, key, vault_id, "bench-b")
            _, keys_b = _timed(lambda: b.keys)
            pulled, pull_s = _sync(b, profiles[1] if profiles else None)
            if pulled.applied != memories or pulled.invalid or pulled.conflicts:
                raise BenchError(f"device B applied {pulled.applied} of {memories}: {pulled}")
            count = b.vault.conn.execute("SELECT count(*) FROM engrams").fetchone()[0]
            if count != memories:
                raise BenchError(f"device B holds {count} memories, not {memories}")
            for memory_id, content in sample.items():
                got = local_store.get_memory(b.vault.conn, memory_id)
                if got is None or got.content != content:
                    raise BenchError(f"memory {memory_id} differs on device B")
        return E2EResult(memories, open_a, open_b, keys_a, keys_b, add_s, push_s, pull_s)
    finally:
        shutil.rmtree(dir_a, ignore_errors=True)
        shutil.rmtree(dir_b, ignore_errors=True)


def _where(file_name: str, line: int, name: str) -> str:
    if file_name == "~":
        return name  # a built-in, e.g. "<method 'execute' of 'sqlite3.Cursor' objects>"
    path = file_name
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    elif path.startswith(str(ROOT) + "/"):
        path = path[len(str(ROOT)) + 1 :]
    else:
        path = Path(path).name
    return f"{path}:{line}({name})"


def top_functions(profile: cProfile.Profile, sort: str, limit: int) -> list[dict[str, Any]]:
    """The `limit` top functions by `sort` ("cumulative" or "tottime")."""
    stats = pstats.Stats(profile)
    table: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = vars(stats)["stats"]
    key = 3 if sort == "cumulative" else 2
    rows = sorted(table.items(), key=lambda item: item[1][key], reverse=True)[:limit]
    return [
        {
            "function": _where(*func),
            "ncalls": calls,
            "tottime_s": round(tottime, 4),
            "cumtime_s": round(cumtime, 4),
        }
        for func, (_, calls, tottime, cumtime, _) in rows
    ]
