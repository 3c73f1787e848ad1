"""A vault whose newest entries are compacted tombstones (PROTOCOL §9, §12; issue 14 item 9).

Real devices, a real relay: the last page of a new device's pull ends at the vault's
sequence (past its last blob, or with no blob at all), the client accepts exactly that,
and later syncs are ordinary empty pulls instead of a full re-pull every time.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import asyncpg

from engram_sync.relay.store.compaction import CompactionResult, compact_vault
from tests.e2e.conftest import VAULT_ID, DeviceHandle, make_device
from tests.e2e.helpers import add, contents, delete
from tests.relay.conftest import Relay
from tests.relay.support import run_db


def _compact(relay: Relay) -> CompactionResult:
    """Age every tombstone and device past the retention period, then compact."""
    relay.sql(
        "UPDATE blobs SET received_at = now() - interval '40 days' WHERE vault_id = $1 AND deleted",
        VAULT_ID,
    )
    relay.sql(
        "UPDATE devices SET last_seen = now() - interval '40 days' WHERE vault_id = $1", VAULT_ID
    )

    async def work(conn: asyncpg.Connection) -> CompactionResult:
        return await compact_vault(conn, VAULT_ID, timedelta(days=30))

    return run_db(relay.database_url, work)


def _deleted_on(alpha: DeviceHandle, texts: list[str], drop: int) -> list[str]:
    ids = [add(alpha, text) for text in texts]
    alpha.sync()
    for memory_id in ids[-drop:]:
        delete(alpha, memory_id)
    alpha.sync()
    alpha.sync()  # alpha pulls past its own tombstones, as any device does before compaction
    return ids


def test_a_new_device_is_not_re_pulled_forever(tmp_path: Path, relay: Relay) -> None:
    alpha = make_device(tmp_path, relay, "alpha")
    ids = _deleted_on(alpha, ["keep", "gone one", "gone two"], drop=2)
    assert _compact(relay) == CompactionResult(VAULT_ID, 2, 5)
    bravo = make_device(tmp_path, relay, "bravo")
    try:
        first = bravo.sync()
        assert (first.applied, first.cursor, first.resynced) == (1, 5, False)
        assert contents(bravo) == {ids[0]: "keep"}
        for device in (bravo, alpha):  # later syncs: nothing to pull, no full re-pull
            later = device.sync()
            assert (later.pulled, later.cursor, later.resynced) == (0, 5, False)
        assert contents(bravo) == {ids[0]: "keep"}
    finally:
        alpha.restart()
        bravo.restart()


def test_a_vault_whose_every_entry_was_compacted(tmp_path: Path, relay: Relay) -> None:
    alpha = make_device(tmp_path, relay, "alpha")
    _deleted_on(alpha, ["gone"], drop=1)
    assert _compact(relay) == CompactionResult(VAULT_ID, 1, 2)
    bravo = make_device(tmp_path, relay, "bravo")
    try:
        first = bravo.sync()  # an empty last page whose cursor jumps to exactly the head
        assert (first.pulled, first.cursor, first.resynced) == (0, 2, False)
        later = bravo.sync()
        assert (later.pulled, later.cursor, later.resynced) == (0, 2, False)
        assert contents(bravo) == {}
    finally:
        alpha.restart()
        bravo.restart()


def test_a_new_device_pulls_a_compacted_vault_over_many_pages(tmp_path: Path, relay: Relay) -> None:
    """The horizon lies above the first page: later pages of a pull that began at 0 carry
    `origin=0` and get no `resync_required` (docs/pull-origin.md)."""
    alpha = make_device(tmp_path, relay, "alpha")
    ids = _deleted_on(alpha, [f"memory {i}" for i in range(6)], drop=2)
    assert _compact(relay) == CompactionResult(VAULT_ID, 2, 8)
    bravo = make_device(tmp_path, relay, "bravo")
    try:
        first = bravo.sync(pull_page=1)
        assert first.resynced is False
        assert contents(bravo) == {i: f"memory {n}" for n, i in enumerate(ids[:4])}
        assert first.cursor == 8  # the head: 6 memories, then 2 tombstones
    finally:
        alpha.restart()
        bravo.restart()
