"""One sync per vault directory at a time (issue 13 item 8), against a real relay."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from engram_sync.client._session import VaultSession
from engram_sync.client._sync.lock import LOCK_FILE, SyncBusyError, _holder, sync_lock
from engram_sync.client._sync.reports import SyncReport
from engram_sync.client._vault import store as local_store
from tests.e2e.conftest import PASSPHRASE
from tests.relay.conftest import ADMIN_KEY, Relay

VAULT = "lock-tests"


def _vault(tmp_path: Path, relay: Relay) -> Path:
    path = tmp_path / "vault"
    with VaultSession.open(path, PASSPHRASE, create=True) as session:
        session.link(relay.url, ADMIN_KEY, VAULT, "laptop")
    return path


def _sync(path: Path, **options: float) -> SyncReport:
    with VaultSession.open(path, PASSPHRASE) as session, session.relay() as relay:
        return session.syncer(relay, **options).sync()


def test_a_second_sync_waits_then_says_another_is_running(tmp_path: Path, relay: Relay) -> None:
    path = _vault(tmp_path, relay)
    with sync_lock(path), pytest.raises(SyncBusyError, match="another sync") as caught:
        _sync(path, lock_wait=0.3)
    assert "process" in str(caught.value)  # names the holder
    assert _sync(path, lock_wait=0.3).pushed == 0  # released: the same sync goes through


def test_a_waiting_sync_runs_once_the_other_finishes(tmp_path: Path, relay: Relay) -> None:
    path = _vault(tmp_path, relay)
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with sync_lock(path):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(10)
    threading.Timer(0.5, release.set).start()
    try:
        assert _sync(path, lock_wait=10).pulled == 0
    finally:
        release.set()
        thread.join()


def test_two_processes_syncing_one_vault_never_reuse_a_clock(tmp_path: Path, relay: Relay) -> None:
    """`watch` and a manual `sync` at once, as two sessions of one directory: each syncs
    under the lock with the clock the other left on disk, so no clock value is used twice
    and every memory lands (before, one crashed on device.json and pushed clocks twice)."""
    path = _vault(tmp_path, relay)
    errors: list[BaseException] = []
    reports: list[SyncReport] = []

    def worker(name: str) -> None:
        try:
            with VaultSession.open(path, PASSPHRASE) as session, session.relay() as client:
                syncer = session.syncer(client)
                for i in range(6):
                    with session.vault.transaction() as conn:
                        local_store.add_memory(conn, f"{name} {i}")
                    reports.append(syncer.sync())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("watch", "manual")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    _sync(path)
    rows = relay.sql("SELECT vector_clock FROM blobs WHERE vault_id = $1 AND NOT deleted", VAULT)
    clocks = [r["vector_clock"] for r in rows]
    assert len(clocks) == 12
    assert len(set(clocks)) == 12


def test_the_lock_file_names_the_holder_over_what_was_there(tmp_path: Path) -> None:
    """Issue 36: no truncate; the pid is written in a fixed width over an older, longer
    content (a holder with a longer pid before), so the file names this holder alone."""
    (tmp_path / LOCK_FILE).write_text("9" * 15 + "\n")
    with sync_lock(tmp_path):
        text = (tmp_path / LOCK_FILE).read_text()
        assert text.strip() == str(os.getpid())
        assert _holder_named(tmp_path) == f" (process {os.getpid()})"


def _holder_named(path: Path) -> str:
    fd = os.open(path / LOCK_FILE, os.O_RDONLY)
    try:
        return _holder(fd)
    finally:
        os.close(fd)
