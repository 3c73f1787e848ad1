"""Client end to end: M memories added on device A (SQLCipher), encrypted and pushed by A,
pulled, verified, decrypted and applied by B, through the relay, with the real client."""

from __future__ import annotations

import contextlib
import cProfile
import pstats
import random
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec
from msgspec import UNSET

from bench.corpus import project, sentence, tags
from bench.relay_load import BenchError
from engram_sync.client import Vault
from engram_sync.client._http.relay_client import RelayClient
from engram_sync.client._session import VaultSession
from engram_sync.client._sync.reports import SyncReport
from engram_sync.client._vault import store as local_store
from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.padding import pad_plaintext
from engram_sync.shared_format.plaintext import tombstone_plaintext

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


# -- issue 36: a sync costs what changed, not what the vault holds ---------------------------

ONE_MEMORY_ROUNDS: Final = 15  # interleaved one-memory round trips per vault size
QUICK_ONE_MEMORY_ROUNDS: Final = 3
SIZES: Final = (10_000, 100_000)
QUICK_SIZES: Final = (200, 1_000)
API_PUSH_BATCH: Final = 500  # the client's own batch (PROTOCOL §8)


@dataclass
class SizeResult:
    """One vault size of `measure_sizes`: the bulk sync of the client and of the relay API,
    and the one-memory round trips of both, interleaved."""

    memories: int
    client_push_s: float  # A's first sync: encrypt and push every memory
    client_pull_s: float  # B's first sync: pull, verify, decrypt and apply every memory
    api_pull_s: float  # the same blobs pulled through RelayClient.pull (pages of 1000)
    api_push_s: float  # and pushed through RelayClient.push to another vault (batches of 500)
    client_ms: list[float]  # A: Vault.add + Vault.sync, then B: Vault.sync (the memory arrives)
    api_ms: list[float]  # one blob: RelayClient.push, then RelayClient.pull from B's cursor

    def as_json(self) -> dict[str, Any]:
        """The figures and the ratios of this size."""
        client = statistics.median(self.client_ms)
        api = statistics.median(self.api_ms)
        n = self.memories
        return {
            "memories": n,
            "client_push_per_s": round(n / self.client_push_s, 1),
            "api_push_per_s": round(n / self.api_push_s, 1),
            "client_pull_apply_per_s": round(n / self.client_pull_s, 1),
            "api_pull_per_s": round(n / self.api_pull_s, 1),
            "push_vs_api": round(self.api_push_s / self.client_push_s, 3),
            "pull_apply_vs_api": round(self.api_pull_s / self.client_pull_s, 3),
            "one_memory_client_ms": round(client, 2),
            "one_memory_api_ms": round(api, 2),
            "one_memory_vs_api": round(client / api, 2),
            "one_memory_client_ms_all": [round(x, 2) for x in self.client_ms],
            "one_memory_api_ms_all": [round(x, 2) for x in self.api_ms],
        }


def _api_bulk(relay_url: str, key: str, vault_id: str, copy_to: str) -> tuple[float, float]:
    """(seconds pulling every blob of `vault_id` through the relay API, seconds pushing
    them to `copy_to`): the relay API's rates on the very blobs the client pushed."""
    pull_s = push_s = 0.0
    cursor = 0
    with RelayClient(relay_url, key, device_id="bench-api") as api:
        while True:
            started = time.perf_counter()
            page = api.pull(vault_id, cursor=cursor, limit=1000)
            pull_s += time.perf_counter() - started
            copies = [msgspec.structs.replace(b, vault_id=copy_to, seq=UNSET) for b in page.blobs]
            for first in range(0, len(copies), API_PUSH_BATCH):
                batch = copies[first : first + API_PUSH_BATCH]
                started = time.perf_counter()
                answer = api.push(copy_to, batch)
                push_s += time.perf_counter() - started
                if answer.accepted != len(batch):
                    raise BenchError(f"the relay API accepted {answer.accepted} of {len(batch)}")
            if not isinstance(page.cursor, int) or not page.has_more:
                return pull_s, push_s
            cursor = page.cursor


class _ApiPair:
    """Two relay API clients on one vault: one pushes a single sealed blob, the other pulls
    it from its cursor (the relay's part of one memory going from A to B)."""

    def __init__(self, relay_url: str, key: str, vault_id: str, sealer: VaultSession) -> None:
        self.vault_id = vault_id
        self.cipher = BlobCipher(sealer.keys)
        self.a = RelayClient(relay_url, key, device_id="bench-api-a")
        self.b = RelayClient(relay_url, key, device_id="bench-api-b")
        self.cursor = 0
        self.clock = 0
        self.round_trip()  # the connections made and the vault's rows in place

    def round_trip(self) -> float:
        self.clock += 1
        blob = self.cipher.seal(
            pad_plaintext(tombstone_plaintext(f"mem_api{self.clock:013d}")),
            vault_id=self.vault_id, memory_id=f"mem_api{self.clock:013d}",
            device_id="bench-api-a", vector_clock=self.clock, deleted=True,
        )  # fmt: skip
        started = time.perf_counter()
        self.a.push(self.vault_id, [blob])
        page = self.b.pull(self.vault_id, cursor=self.cursor, limit=1000)
        took = (time.perf_counter() - started) * 1000
        if [b.memory_id for b in page.blobs] != [blob.memory_id]:
            raise BenchError("the relay API round trip did not bring the blob")
        assert isinstance(page.cursor, int)
        self.cursor = page.cursor
        return took

    def close(self) -> None:
        self.a.close()
        self.b.close()


def _client_round_trip(a: Vault, b: Vault, n: int) -> float:
    """A adds one memory and syncs, B syncs and has it: milliseconds."""
    started = time.perf_counter()
    memory_id = a.add(f"one memory more, number {n}")
    if a.sync().pushed != 1:
        raise BenchError("device A did not push its one memory")
    if b.sync().applied != 1:
        raise BenchError("device B did not apply the one memory")
    took = (time.perf_counter() - started) * 1000
    if b.get(memory_id) is None:
        raise BenchError("the one memory did not reach device B")
    return took


@dataclass
class _Sized:
    """One vault size set up: its two devices, the bulk figures, the relay API pair."""

    memories: int
    a: Vault
    b: Vault
    pair: _ApiPair
    bulk: tuple[float, float, float, float]  # client push, client pull, api pull, api push s
    client_ms: list[float]
    api_ms: list[float]

    def result(self) -> SizeResult:
        return SizeResult(self.memories, *self.bulk, self.client_ms, self.api_ms)


def _set_up(
    stack: contextlib.ExitStack,
    base: Path,
    relay_url: str,
    key: str,
    memories: int,
    log: Callable[[str], None],
) -> _Sized:
    """A fills and pushes, B pulls (the client's bulk rates), the relay API pulls and
    pushes the same blobs (its rates); the devices stay open for the round trips."""
    vault_id = f"sizes-{memories}"
    rng = random.Random(memories)  # noqa: S311 - test data, not crypto
    sessions = []
    for side in ("a", "b"):
        where = base / f"{vault_id}-{side}"
        stack.callback(shutil.rmtree, where, ignore_errors=True)
        session = stack.enter_context(VaultSession.open(where, PASSPHRASE, create=True))
        session.link(relay_url, key, vault_id, f"bench-{side}")
        _ = session.keys
        sessions.append(session)
    log(f"  {memories} memories: filling device A")
    for first in range(0, memories, ADD_CHUNK):
        with sessions[0].vault.transaction() as conn:
            for _ in range(first, min(first + ADD_CHUNK, memories)):
                local_store.add_memory(conn, sentence(rng), tags=tags(rng), project=project(rng))
    a, b = Vault(sessions[0]), Vault(sessions[1])
    log(f"  {memories} memories: A pushes, B pulls and applies (the client)")
    pushed, push_s = _timed(a.sync)
    pulled, pull_s = _timed(b.sync)
    if pushed.pushed != memories or pulled.applied != memories:
        raise BenchError(f"bulk sync: pushed {pushed.pushed}, applied {pulled.applied}")
    log(f"  {memories} memories: the same blobs through the relay API")
    api_pull_s, api_push_s = _api_bulk(relay_url, key, vault_id, f"{vault_id}-api")
    pair = _ApiPair(relay_url, key, f"{vault_id}-rt", sessions[0])
    stack.callback(pair.close)
    _client_round_trip(a, b, 0)  # warm: the first check of each side
    return _Sized(memories, a, b, pair, (push_s, pull_s, api_pull_s, api_push_s), [], [])


def measure_sizes(
    base: Path,
    relay_url: str,
    key: str,
    *,
    quick: bool,
    log: Callable[[str], None],
    sizes: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """Issue 36's client rows: each size of SIZES (QUICK_SIZES, or `sizes`) set up, then the
    one-memory round trips of every size, client and relay API, interleaved round by round
    (so a change of the machine's load falls on all of them alike), and the cost ratio of
    the client's round trip, largest size to smallest, all in one run."""
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    rounds = QUICK_ONE_MEMORY_ROUNDS if quick else ONE_MEMORY_ROUNDS
    with contextlib.ExitStack() as stack:
        set_up = []
        for memories in sizes:
            log(f"client sync against vault size: {memories} memories")
            set_up.append(_set_up(stack, base, relay_url, key, memories, log))
        log(f"one memory A -> B: {rounds} rounds, interleaved over the sizes")
        for n in range(1, rounds + 1):
            for sized in set_up:
                sized.client_ms.append(_client_round_trip(sized.a, sized.b, n))
                sized.api_ms.append(sized.pair.round_trip())
        results = [sized.result().as_json() for sized in set_up]
    small, large = results[0], results[-1]
    return {
        "rounds": rounds,
        "sizes": results,
        "one_memory_large_vs_small": round(
            large["one_memory_client_ms"] / small["one_memory_client_ms"], 3
        ),
    }


def main(argv: list[str] | None = None) -> int:
    """Issue 36's client rows alone (`python -m bench.client_e2e`), on their own embedded
    PostgreSQL and relay process; `--sizes 10000,100000` by default."""
    import argparse
    import os

    from bench.alone import run_alone
    from bench.targets import client_size_targets

    parser = argparse.ArgumentParser(prog="python -m bench.client_e2e")
    parser.add_argument("--quick", action="store_true", help="small sizes and 3 round trips")
    parser.add_argument("--sizes", help="comma-separated vault sizes, smallest first")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else None

    def sections(scratch: Path, url: str, key: str, log: Callable[[str], None]) -> dict[str, Any]:
        result = measure_sizes(scratch, url, key, quick=args.quick, log=log, sizes=sizes)
        result["load_average_end"] = os.getloadavg()
        return result

    return run_alone(sections, client_size_targets)


if __name__ == "__main__":
    raise SystemExit(main())
