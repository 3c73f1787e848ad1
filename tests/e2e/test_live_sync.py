"""Live sync through the real relay (issue 15, PROTOCOL §15): `engram-sync watch` and
`Vault.watch()` learn of another device's push from the event stream (their timer set so
far out that only the feed can explain the sync), push what another program writes into
their engrams.db, end on revocation, refuse an unlinked vault with the fix, and do not
download their own pushes again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engram_sync.client import LiveStatus, SyncReport, Vault
from engram_sync.client._sync.engine import Syncer
from tests.e2e.conftest import PASSPHRASE, VAULT_ID, DeviceHandle
from tests.e2e.helpers import add, contents
from tests.e2e.live_support import NEVER, Watcher, wait_for

BIN = Path(sys.executable).parent
ENV = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE)


def start_watch(device: DeviceHandle) -> subprocess.Popen[str]:
    device.restart()  # the CLI process opens the vault itself
    return subprocess.Popen(
        [str(BIN / "engram-sync"), "--vault", str(device.path), "watch", "--interval",
         str(int(NEVER))],
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def stop_watch(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def synced_once(device: DeviceHandle) -> bool:
    """The watching process has finished a sync (link alone writes no last_sync_at)."""
    state = json.loads((device.path / "sync_state.json").read_text(encoding="utf-8"))
    return state.get("last_sync_at") is not None


def holds(device: DeviceHandle, memory_id: str) -> bool:
    held = memory_id in contents(device)
    device.restart()  # close again: the watching process owns the vault
    return held


def test_a_push_reaches_a_watching_cli_device_through_the_event_stream(
    devices: list[DeviceHandle],
) -> None:
    alpha, bravo, _ = devices
    proc = start_watch(alpha)
    try:
        # the first sync and the stream: a memory pushed before the stream is up is still
        # found (the stream starts at the device's cursor, PROTOCOL §15)
        memory = add(bravo, "appears on alpha while it watches, from the feed alone")
        bravo.sync()
        wait_for(lambda: holds(alpha, memory), "the memory on the watching device")
        later = add(bravo, "and a second one, once the stream is surely up")
        bravo.sync()
        wait_for(lambda: holds(alpha, later), "the second memory on the watching device")
    finally:
        code, out, err = stop_watch(proc)
    assert code == 0, err
    assert "status: connected (live events)" in err
    assert "applied 1" in out
    assert "stopped" in err


def test_a_write_by_another_program_is_pushed_by_a_running_watch(
    devices: list[DeviceHandle],
) -> None:
    alpha, bravo, _ = devices
    proc = start_watch(alpha)
    try:
        wait_for(lambda: synced_once(alpha), "the watch's first sync")
        # this test process is the other program: it writes into alpha's engrams.db through
        # the library while the watch holds the vault open
        with Vault.open(alpha.path, PASSPHRASE) as vault:
            memory = vault.add("written by another program into engrams.db")

        def arrived() -> bool:
            bravo.sync()
            return memory in contents(bravo)

        wait_for(arrived, "the external write, pushed by the watch and pulled by bravo")
    finally:
        code, out, err = stop_watch(proc)
    assert code == 0, err
    assert "pushed 1" in out


def test_revocation_ends_the_watch_with_a_clear_message(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    with alpha.open() as session:
        device_id = session.device.device_id
    proc = start_watch(alpha)
    try:
        wait_for(lambda: synced_once(alpha), "the watch's first sync")
        memory = add(bravo, "the stream is up once this arrives")
        bravo.sync()
        wait_for(lambda: holds(alpha, memory), "the memory on the watching device")
        with bravo.relay_client() as admin:
            admin.revoke_device(VAULT_ID, device_id)
        wait_for(lambda: proc.poll() is not None, "the watch to end after the revocation")
    finally:
        code, _, err = stop_watch(proc)
    assert code == 1, err
    assert f"this device ({device_id}) was revoked" in err
    assert "engram-sync link" in err  # what to do
    with alpha.open() as session:
        assert session.state.revoked


def test_watch_on_an_unlinked_vault_exits_at_once_with_the_fix(tmp_path: Path) -> None:
    vault = tmp_path / "unlinked"
    init = subprocess.run([str(BIN / "engram-sync"), "--vault", str(vault), "init"], env=ENV,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert init.returncode == 0, init.stderr
    done = subprocess.run([str(BIN / "engram-sync"), "--vault", str(vault), "watch"], env=ENV,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1
    assert "not linked to a relay" in done.stderr
    assert "engram-sync link --relay URL --api-key KEY" in done.stderr
    # (the positive case, a linked vault watching, is every other test here)


def test_own_pushes_are_not_pulled_back(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    for n in range(3):
        add(alpha, f"alpha {n}")
    first = alpha.sync()
    assert (first.pushed, first.own_skipped, first.cursor) == (3, 3, 3)
    again = alpha.sync()
    assert again.pulled == 0  # before issue 15 this pulled its own 3 blobs back
    # with another device's commit in between, the next pull fetches the range as usual
    theirs = add(bravo, "bravo's")
    bravo.sync()  # seq 4
    add(alpha, "alpha 3")  # alpha's next sync pulls seq 4 first, then pushes seq 5
    third = alpha.sync()
    assert (third.pulled, third.applied, third.own_skipped, third.cursor) == (1, 1, 1, 5)
    assert theirs in contents(alpha)
    assert alpha.sync().pulled == 0


def test_a_watching_device_never_downloads_its_own_pushes(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    alpha.restart()
    watch = Watcher(alpha.path).start()
    try:
        with Vault.open(alpha.path, PASSPHRASE) as vault:
            for n in range(3):
                vault.add(f"external {n}")
        wait_for(lambda: sum(r.pushed for r in list(watch.reports)) >= 3, "three pushes")
        theirs = add(bravo, "from bravo")
        bravo.sync()
        wait_for(lambda: watch.applied >= 1, "bravo's memory on alpha")
    finally:
        watch.stop()
    assert watch.error is None
    assert sum(r.pulled for r in watch.reports) == 1  # bravo's blob only, never its own
    assert theirs in contents(alpha)


def test_vault_watch_in_the_library_is_live(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    alpha.restart()
    stop = threading.Event()
    statuses: list[LiveStatus] = []
    reports: list[SyncReport] = []
    pushed: list[str] = []

    def other_device() -> None:  # bravo, once alpha's feed is up
        wait_for(lambda: any(s.state == "connected" for s in list(statuses)), "connected")
        with Vault.open(bravo.path, PASSPHRASE) as vault:
            pushed.append(vault.add("from bravo, to a library watch"))
            vault.sync()

    bravo.restart()
    helper = threading.Thread(target=other_device, daemon=True)
    helper.start()
    watchdog = threading.Timer(180, stop.set)  # a failure ends the watch, it does not hang
    watchdog.start()
    with Vault.open(alpha.path, PASSPHRASE) as vault:
        for _ in vault.watch(interval=NEVER, stop=stop, on_status=statuses.append,
                                  on_report=reports.append):  # fmt: skip
            if pushed and vault.get(pushed[0]) is not None:
                stop.set()
        arrived = bool(pushed) and vault.get(pushed[0]) is not None
    watchdog.cancel()
    helper.join(60)
    assert arrived, "the memory never reached the library watch"
    assert next(s.mode for s in statuses if s.state == "connected") == "events"
    assert sum(r.applied for r in reports) == 1


def test_a_write_committed_while_a_sync_runs_is_pushed_by_the_next_sync(
    devices: list[DeviceHandle], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another connection (an MCP server's tools, another program) commits while the watch's
    sync runs, after its push read the vault: the change still starts the next sync (the
    marker keeps the data_version read before the sync), not only the timer. Without it,
    the write waited for the timer (NEVER here): broken once on purpose, it failed."""
    alpha, _, _ = devices
    alpha.restart()
    real_sync = Syncer.sync
    written: list[str] = []
    stop = threading.Event()
    with Vault.open(alpha.path, PASSPHRASE) as other, Vault.open(alpha.path, PASSPHRASE) as vault:

        def sync_then_commit(self: Syncer, **options: Any) -> SyncReport:
            report = real_sync(self, **options)
            if not written:  # the first sync's push is over: commit through another connection
                written.append(other.add("committed while a sync ran"))
            return report

        monkeypatch.setattr(Syncer, "sync", sync_then_commit)
        watchdog = threading.Timer(60, stop.set)
        watchdog.start()
        pushed = 0
        for report in vault.watch(interval=NEVER, stop=stop):
            pushed += report.pushed
            if pushed:
                stop.set()
        watchdog.cancel()
    assert written
    assert pushed == 1, "the write committed during a sync was left for the timer"


def test_a_flood_of_wakes_starts_no_more_syncs_than_the_gap_allows(
    devices: list[DeviceHandle],
) -> None:
    """A program that sets `wake` after each write (`engram-sync mcp`'s tools) makes the
    watch look at once, but the watch still starts no two syncs within `min_sync_gap_s`
    (0.5 s): 200 writes each followed by a wake, one every ~10 ms, cost a sync per half
    second at most, and every write is pushed. Broken once on purpose (the gap's wait
    skipped while woken): 29 syncs in 3.8 s where 8 were allowed, and the test failed."""
    alpha, _, _ = devices
    alpha.restart()
    wake, stop = threading.Event(), threading.Event()
    started: list[float] = []
    flood_at: list[float] = []

    def flood() -> None:
        wait_for(lambda: bool(started) or stop.is_set(), "the watch's first sync")
        with Vault.open(alpha.path, PASSPHRASE) as other:
            flood_at.append(time.monotonic())
            for index in range(200):
                other.add(f"written and woken {index}")
                wake.set()
                time.sleep(0.01)  # a write every ~10 ms for two seconds or more

    writer = threading.Thread(target=flood, daemon=True)
    writer.start()
    watchdog = threading.Timer(90, stop.set)
    watchdog.start()
    pushed = 0
    with Vault.open(alpha.path, PASSPHRASE) as vault:
        for report in vault.watch(interval=NEVER, stop=stop, wake=wake):
            started.append(time.monotonic())
            pushed += report.pushed
            if pushed >= 200:
                stop.set()
    watchdog.cancel()
    writer.join(30)
    assert pushed == 200
    syncs = [at for at in started if at > flood_at[0]]
    allowed = (started[-1] - flood_at[0]) / 0.5 + 1  # LiveTiming.min_sync_gap_s
    assert len(syncs) <= allowed, (len(syncs), started[-1] - flood_at[0])
