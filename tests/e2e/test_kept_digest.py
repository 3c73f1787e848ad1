"""The kept digest (issue 36, client._vault.kept_digest; docs/digest.md "Kept on the device"):
a real relay and real SQLCipher vaults. After every kind of change (add, edit, delete, pull,
conflict, a strict_local change, a retraction, a restore, an undelete, a revert, a row
deleted by hand) the value each device keeps, with its notes folded in, is the one
recomputed from every held version, without being recomputed; a wrong kept value is
caught and put right by `engram-sync verify --deep`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from engram_sync.client import Vault
from engram_sync.client._sync.anti_entropy import AntiEntropy
from engram_sync.client._sync.reports import SyncReport
from engram_sync.client._vault import store as local_store
from engram_sync.client._vault.held_versions import held_versions
from engram_sync.client._vault.kept_digest import BULK_NOTES, fold_changes, kept_digest
from engram_sync.shared_format.digest import fold
from tests.e2e.conftest import PASSPHRASE, DeviceHandle
from tests.e2e.helpers import add, sync_all

EXE = str(Path(sys.executable).parent / "engram-sync")


def _kept_is_recomputed(*devices: DeviceHandle) -> None:
    for device in devices:
        with device.open() as session, session.vault.transaction() as conn:
            kept = fold_changes(conn)  # None: no kept value (a recomputation would follow)
            assert kept is not None, device.name
            assert kept == fold(held_versions(conn)), device.name
            assert conn.execute("SELECT count(*) FROM sync_digest_dirty").fetchone()[0] == 0


def _vault(device: DeviceHandle) -> Vault:
    with device.open() as session:
        return Vault(session)


def _sync(device: DeviceHandle) -> SyncReport:
    """A sync whose digest check found the kept value right: never recomputed (a wrong
    kept value would be put right by the check, and `_kept_is_recomputed` see nothing)."""
    report = device.sync()
    assert report.digest is not None, device.name
    assert report.digest.checked, device.name
    assert not report.digest.kept_repaired, device.name
    return report


def _sync_all(*devices: DeviceHandle) -> None:
    for _ in range(2):
        for device in devices:
            _sync(device)


def test_the_kept_digest_follows_every_kind_of_change(devices: list[DeviceHandle]) -> None:
    alpha, bravo, charlie = devices
    ids = [add(alpha, f"memory {i}") for i in range(6)]
    _kept_is_recomputed(alpha, bravo)
    _sync_all(alpha, bravo)  # push on alpha, pull on bravo
    _kept_is_recomputed(alpha, bravo)
    a, b = _vault(alpha), _vault(bravo)
    a.edit(ids[0], "edited on alpha")
    a.delete(ids[1])
    _kept_is_recomputed(alpha)
    _sync_all(alpha, bravo)
    _kept_is_recomputed(alpha, bravo)
    # a conflict: both edit one memory, alpha's edit reaches the relay first
    a.edit(ids[2], "alpha's side")
    b.edit(ids[2], "bravo's side")
    _sync(alpha)
    assert _sync(bravo).conflicts == 1
    _kept_is_recomputed(alpha, bravo)
    _sync_all(alpha, bravo)
    # strict_local (docs/privacy.md): made local, retracted, a local one deleted here only
    b.edit(ids[3], privacy_level="strict_local")
    local = b.add("never leaves bravo", privacy_level="strict_local")
    _kept_is_recomputed(bravo)
    b.retract(ids[3])
    b.delete(ids[4])
    b.edit(ids[5], privacy_level="strict_local")
    b.delete(ids[5])
    b.delete(local)
    _kept_is_recomputed(bravo)
    _sync_all(alpha, bravo)
    _kept_is_recomputed(alpha, bravo)
    # the local history (docs/history.md): undelete, restore, a revert by device
    a.undelete(ids[1])
    a.restore(ids[0], 1)
    _kept_is_recomputed(alpha)
    _sync_all(alpha, bravo, charlie)
    _kept_is_recomputed(alpha, bravo, charlie)
    plan = _vault(charlie).revert(device=alpha.session.device.device_id)  # type: ignore[union-attr]
    assert plan.steps
    _kept_is_recomputed(charlie)
    _sync_all(alpha, bravo, charlie)
    _kept_is_recomputed(alpha, bravo, charlie)
    # a row deleted by hand, outside engram-sync: the triggers note it too
    last = add(charlie, "one more")
    add(charlie, "and another (the hand-deleted row's rowid is not the newest)")
    _sync_all(charlie, bravo)
    with bravo.open() as session:
        session.vault.conn.execute("DELETE FROM engrams WHERE id = ?", (last,))
    _kept_is_recomputed(bravo)
    assert _sync(bravo).digest.restored == 1  # type: ignore[union-attr]
    _kept_is_recomputed(alpha, bravo, charlie)


def test_the_kept_digest_follows_batches_noted_in_bulk(devices: list[DeviceHandle]) -> None:
    """Batches of BULK_NOTES memories or more are noted by `note_changing`, not the
    triggers: a first push and a pull of fresh memories, then a push of edits (versions
    held before) and its pull, a mix of both."""
    alpha, bravo, _ = devices
    count = BULK_NOTES + 20
    with alpha.open() as session, session.vault.transaction() as conn:
        ids = [local_store.add_memory(conn, f"bulk {i}") for i in range(count)]
    _sync_all(alpha, bravo)
    _kept_is_recomputed(alpha, bravo)
    with alpha.open() as session, session.vault.transaction() as conn:
        for memory_id in ids:
            assert local_store.edit_memory(conn, memory_id, f"edited {memory_id}")
        for i in range(count):
            local_store.add_memory(conn, f"more {i}")
    _sync_all(alpha, bravo)
    _kept_is_recomputed(alpha, bravo)


def test_a_missing_or_invalid_kept_digest_is_recomputed(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    for i in range(3):
        add(alpha, f"memory {i}")
    sync_all(alpha, bravo)
    for broken in ("DELETE FROM sync_digest", "UPDATE sync_digest SET digest = x'00'",
                   "UPDATE sync_digest SET count = -1"):  # fmt: skip
        with bravo.open() as session:
            session.vault.conn.execute(broken)
            assert kept_digest(session.vault) == fold(held_versions(session.vault.conn))
        _kept_is_recomputed(bravo)


def _verify(device: DeviceHandle, *args: str) -> dict[str, object]:
    env = {**os.environ, "ENGRAM_PASSPHRASE": PASSPHRASE}
    env.pop("ENGRAM_VAULT", None)
    done = subprocess.run(
        [EXE, "--vault", str(device.path), "verify", "--json", *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    body: dict[str, object] = json.loads(done.stdout)
    return body


def test_verify_deep_catches_a_wrong_kept_digest(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    for i in range(4):
        add(alpha, f"memory {i}")
    sync_all(alpha, bravo)
    with bravo.open() as session, session.relay() as relay:  # the positive case, in process
        syncer = session.syncer(relay, check_digest=False)
        deep = AntiEntropy(syncer, SyncReport(), deep=True).run(repair=False)
        assert (deep.kept_repaired, deep.matched) == (False, True)
    with bravo.open() as session:  # a valid value, but not the one of the rows
        session.vault.conn.execute("UPDATE sync_digest SET digest = randomblob(32)")
    bravo.restart()
    body = _verify(bravo, "--deep")
    assert (body["kept_repaired"], body["matched"]) == (True, True)
    _kept_is_recomputed(bravo)
