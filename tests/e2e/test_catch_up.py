"""An offline device catches up, and a restart mid-pull resumes from the cursor (PROTOCOL §9)."""

from __future__ import annotations

import contextlib

from engram_sync.client._sync.reports import SyncReport
from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add, contents


class SimulatedCrashError(Exception):
    """Stands for the process dying after some pages were applied."""


def _bulk_add(device: DeviceHandle, count: int, prefix: str) -> list[str]:
    from engram_sync.client._vault import store as local_store

    with device.open() as session, session.vault.transaction() as conn:
        return [local_store.add_memory(conn, f"{prefix} {i}") for i in range(count)]


def test_offline_device_catches_up_after_1000_changes(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    ids = _bulk_add(alpha, 900, "bulk")
    alpha.sync()
    from engram_sync.client._vault import store as local_store

    with alpha.open() as session, session.vault.transaction() as conn:
        for memory_id in ids[:60]:
            local_store.edit_memory(conn, memory_id, f"edited {memory_id}")
        for memory_id in ids[60:100]:
            local_store.delete_memory(conn, memory_id)
    assert alpha.sync().pushed == 100  # 900 + 100 = 1,000 changes while bravo was away

    report = bravo.sync()
    assert report.applied == 900  # each memory's newest version only
    assert contents(bravo) == contents(alpha)
    assert len(contents(bravo)) == 860


def test_restart_mid_pull_resumes_without_redownloading(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    _bulk_add(alpha, 250, "page")
    alpha.sync()

    pages: list[int] = []

    def crash_after_two_pages(phase: str, report: SyncReport) -> None:
        if phase == "pull":
            pages.append(report.pulled)
            if len(pages) == 2:
                raise SimulatedCrashError

    with bravo.open() as session, session.relay() as client:
        syncer = session.syncer(client, crash_after_two_pages, pull_page=100)
        with contextlib.suppress(SimulatedCrashError):
            syncer.sync()
    assert pages == [100, 200]
    bravo.restart()  # a new process: state comes back from disk

    with bravo.open() as session:
        assert session.state.cursor == 200
    report = bravo.sync(pull_page=100)
    assert report.pulled == 50  # only what was not applied before the crash
    assert len(contents(bravo)) == 250


def test_crash_between_apply_and_cursor_write_is_harmless(devices: list[DeviceHandle]) -> None:
    """If the cursor write is lost, the page comes again and is recognised as known."""
    alpha, bravo, _ = devices
    add(alpha, "x")
    alpha.sync()
    bravo.sync()
    with bravo.open() as session:
        session.state.cursor = 0  # as if the state file had not been written
        session.state.save()
    report = bravo.sync()
    assert (report.pulled, report.applied, report.stale, report.conflicts) == (1, 0, 1, 0)


def test_pushes_page_through_rows_and_tombstones_in_batches(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    ids = _bulk_add(alpha, 30, "batched")
    assert alpha.sync(push_batch=7).pushed == 30  # 5 batches of rows
    from engram_sync.client._vault import store as local_store

    with alpha.open() as session, session.vault.transaction() as conn:
        for memory_id in ids[:20]:
            local_store.delete_memory(conn, memory_id)
    assert alpha.sync(push_batch=7).pushed == 20  # 3 batches of tombstones
    with alpha.open() as session:
        assert local_store.count_to_push(session.vault.conn) == (0, 0)
    bravo.sync()
    assert sorted(contents(bravo)) == sorted(ids[20:])
