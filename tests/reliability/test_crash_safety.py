"""Crash safety (issue 8 §1): SIGKILL the relay while a client pushes, and SIGKILL the
client mid-push and mid-pull. Nothing acknowledged is lost, nothing is duplicated, no
clock value is reused, no blob is skipped.

CI size: a few thousand memories and a handful of kills; `--full` runs 10k
memories and 20 relay kills.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg

from engram_sync.client._errors import SyncError
from engram_sync.client._session import VaultSession
from engram_sync.client._vault import store as local_store
from engram_sync.client._vault.held_versions import held_versions
from engram_sync.relay.store.bucket_prefixes import count_list
from engram_sync.shared_format.digest import Version, digest_int, fold
from tests import tiers
from tests.relay.bucket_oracle import versions_buckets
from tests.relay.conftest import ADMIN_KEY
from tests.relay.support import run_db
from tests.reliability.support import RelayProcess

FULL = tiers.full()  # --full: the full sizes (tests/tiers.py)
BIN = Path(sys.executable).parent
PASSPHRASE = "crash safety passphrase"
VAULT = "crash-vault"


def _vault(path: Path, relay: RelayProcess, memories: int = 0) -> list[str]:
    with VaultSession.open(path, PASSPHRASE, create=True) as session:
        session.link(relay.url, ADMIN_KEY, VAULT, path.name)
        with session.vault.transaction() as conn:
            return [local_store.add_memory(conn, f"memory {i}") for i in range(memories)]


def _contents(path: Path) -> dict[str, str]:
    with VaultSession.open(path, PASSPHRASE) as session:
        return {m.id: m.content for m in local_store.list_memories(session.vault.conn)}


def _assert_digests(relay: RelayProcess, *vaults: Path) -> None:
    """PROTOCOL §18: the relay's stored digest equals the one recomputed from its rows,
    and each device's digest over the versions it holds (docs/digest.md); so do its stored
    bucket prefixes and counts (revision 0012)."""

    async def read(conn: asyncpg.Connection) -> tuple[asyncpg.Record, int, list[asyncpg.Record]]:
        row = await conn.fetchrow(
            "SELECT digest, live_blobs + tombstones AS n, bucket_prefixes, bucket_counts"
            " FROM vaults WHERE vault_id = $1",
            VAULT,
        )
        rows = await conn.fetch(
            "SELECT memory_id, device_id, vector_clock, deleted FROM blobs WHERE vault_id = $1",
            VAULT,
        )
        return row, row["n"], rows

    stored, count, rows = run_db(relay.database_url, read)
    recomputed = fold(Version(*r) for r in rows)
    assert (digest_int(stored["digest"]), count) == recomputed
    buckets = versions_buckets(Version(*r) for r in rows)
    assert (stored["bucket_prefixes"], count_list(stored["bucket_counts"])) == buckets
    for path in vaults:
        with VaultSession.open(path, PASSPHRASE) as session:
            assert fold(held_versions(session.vault.conn)) == recomputed, path.name
            assert versions_buckets(held_versions(session.vault.conn)) == buckets, path.name


def _sync_until_done(
    path: Path, relay: RelayProcess, attempts: int = 60, push_batch: int = 500
) -> None:
    for _ in range(attempts):
        try:
            with (
                VaultSession.open(path, PASSPHRASE) as session,
                session.relay(
                    max_retries=2, backoff_base=0.05, backoff_max=0.2, timeout=10
                ) as client,
            ):
                session.syncer(client, push_batch=push_batch).sync()
                return
        except SyncError:
            time.sleep(0.3)
    raise AssertionError("sync never completed")


def _sql(relay: RelayProcess, query: str) -> list[Any]:
    """`query` (with `$1` = the test's vault) on the relay's database."""
    from tests.relay.conftest import Relay

    return Relay(relay.url, relay.database_url, None).sql(query, VAULT)  # type: ignore[arg-type]


def _relay_rows(relay: RelayProcess) -> list[tuple[str, str, int]]:
    rows = _sql(relay, "SELECT memory_id, device_id, vector_clock FROM blobs WHERE vault_id = $1")
    return [(r["memory_id"], r["device_id"], r["vector_clock"]) for r in rows]


def _sql_int(relay: RelayProcess, query: str) -> int:
    return int(_sql(relay, query)[0][0])


def _blobs_stored(relay: RelayProcess) -> int:
    """Push progress as the relay sees it."""
    return _sql_int(relay, "SELECT count(*) FROM blobs WHERE vault_id = $1")


def _reader_cursor(relay: RelayProcess, device_id: str) -> int:
    """Pull progress as the relay sees it: the cursor it recorded for the reading device."""
    assert all(c in "0123456789abcdef-" for c in device_id), device_id  # quoted below
    return _sql_int(
        relay,
        "SELECT coalesce(max(pulled_cursor), 0) FROM devices WHERE vault_id = $1"
        f" AND device_id = '{device_id}'",
    )


def _device_id(path: Path) -> str:
    with VaultSession.open(path, PASSPHRASE) as session:
        return session.device.device_id


def _wait_for_progress(progress: Callable[[], int], since: int, running: Callable[[], bool],
                       deadline: float = 120.0) -> bool:  # fmt: skip
    """Poll until `progress()` passes `since` (True) or `running()` turns false (False).

    Kills are paced by progress, not by the clock: a kill then always lands in the middle
    of the work, however fast the machine or the code is.
    """
    stop = time.monotonic() + deadline
    while running() and time.monotonic() < stop:
        if progress() > since:
            return True
        time.sleep(0.02)
    return False


def test_relay_killed_during_pushes_loses_nothing(
    relay_process: RelayProcess, tmp_path: Path
) -> None:
    count, kills = (10_000, 20) if FULL else (3_000, 4)
    rng = random.Random(int(os.environ.get("ENGRAM_SEED", "7")))
    ids = _vault(tmp_path / "pusher", relay_process, count)
    import threading

    done = threading.Event()
    errors: list[BaseException] = []

    def push() -> None:
        try:
            # Pushes of 100: enough batches for every kill to land mid-push.
            _sync_until_done(tmp_path / "pusher", relay_process, attempts=200, push_batch=100)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=push)
    worker.start()
    killed = 0
    while killed < kills and not done.is_set():
        since = _blobs_stored(relay_process)
        if not _wait_for_progress(lambda: _blobs_stored(relay_process), since,
                                  lambda: not done.is_set()):  # fmt: skip
            break
        time.sleep(rng.uniform(0.0, 0.05))  # somewhere in the next batch or two
        if done.is_set():
            break
        relay_process.kill()
        killed += 1
        time.sleep(rng.uniform(0.0, 0.5))
        relay_process.start()
    worker.join(timeout=600)
    assert not errors, errors
    assert killed >= 1, "the push finished before any kill: raise the size"
    print(f"crash safety: relay SIGKILLed {killed} times during a push of {count} memories")

    rows = _relay_rows(relay_process)
    assert sorted(r[0] for r in rows) == sorted(ids)  # every memory exactly once
    clocks = [r[2] for r in rows]
    assert len(set(clocks)) == len(clocks)  # no clock value used twice
    with VaultSession.open(tmp_path / "pusher", PASSPHRASE) as session:
        assert local_store.count_to_push(session.vault.conn) == (0, 0)
        assert session.device.vector_clock >= max(clocks)

    _vault(tmp_path / "reader", relay_process)
    _sync_until_done(tmp_path / "reader", relay_process)
    assert _contents(tmp_path / "reader") == _contents(tmp_path / "pusher")
    _assert_digests(relay_process, tmp_path / "pusher", tmp_path / "reader")


def _cli(vault: Path, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE)
    return subprocess.Popen(
        [str(BIN / "engram-sync"), "--vault", str(vault), *args],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _kill_cli_runs_until_one_finishes(
    vault: Path, rng: random.Random, kills: int, progress: Callable[[], int],
    max_delay: float = 0.3,
) -> int:  # fmt: skip
    """Run `engram-sync sync` and SIGKILL it a random moment (up to `max_delay` s) after it
    made progress, `kills` times (fewer if a run finishes first); then let a final run
    finish. Returns how many runs were killed before finishing."""
    killed = 0
    for _ in range(kills):
        proc = _cli(vault, "sync")

        def running(proc: subprocess.Popen[bytes] = proc) -> bool:
            return proc.poll() is None

        if not _wait_for_progress(progress, progress(), running):
            proc.wait(timeout=60)
            break  # this run finished: nothing left to interrupt
        time.sleep(rng.uniform(0.0, max_delay))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        proc.wait(timeout=60)
    final = _cli(vault, "sync")
    assert final.wait(timeout=600) == 0
    return killed


def test_client_killed_mid_push_and_mid_pull_stays_consistent(
    relay_process: RelayProcess, tmp_path: Path
) -> None:
    count, kills = (10_000, 10) if FULL else (3_000, 3)
    rng = random.Random(int(os.environ.get("ENGRAM_SEED", "11")))
    ids = _vault(tmp_path / "writer", relay_process, count)
    # The kill lands within 50 ms of a batch stored: a push of 3,000 takes about 0.2 s on a
    # quiet machine since issue 36 (the default 0.3 s let every run finish first)
    killed_push = _kill_cli_runs_until_one_finishes(
        tmp_path / "writer", rng, kills, lambda: _blobs_stored(relay_process), max_delay=0.05
    )

    rows = _relay_rows(relay_process)
    assert sorted(r[0] for r in rows) == sorted(ids)
    clocks = [r[2] for r in rows]
    assert len(set(clocks)) == len(clocks)
    with VaultSession.open(tmp_path / "writer", PASSPHRASE) as session:
        assert session.device.vector_clock >= max(clocks)  # persisted before use
        assert local_store.count_to_push(session.vault.conn) == (0, 0)

    # A pull of 3,000 is three pages: the relay records the first as it serves it, and
    # the rest of the run can be short on a fast machine. A reader whose every run
    # finished before a kill landed is replaced by a fresh one, killed sooner.
    killed_pull, reader = 0, tmp_path / "reader"
    for attempt in range(3):
        reader = tmp_path / f"reader{attempt}"
        _vault(reader, relay_process)
        device_id = _device_id(reader)
        killed_pull = _kill_cli_runs_until_one_finishes(
            reader, rng, kills, functools.partial(_reader_cursor, relay_process, device_id),
            max_delay=0.1 / (attempt + 1),
        )  # fmt: skip
        if killed_pull:
            break
    assert _contents(reader) == _contents(tmp_path / "writer")
    _assert_digests(relay_process, tmp_path / "writer", reader)
    with VaultSession.open(reader, PASSPHRASE) as session:
        assert session.state.cursor == _sql_int(
            relay_process, "SELECT max(seq) FROM blobs WHERE vault_id = $1"
        )
        assert session.state.skipped == []
    assert killed_push >= 1, "no push was killed: raise the size"
    assert killed_pull >= 1, "no pull was killed: raise the size"
    print(
        f"crash safety: client SIGKILLed {killed_push} times mid-push and {killed_pull} times"
        f" mid-pull of {count} memories"
    )
