"""A pulled page keeps the versions it replaces in bulk (client._vault.history.PageKeeper,
issue 35's pull overhead), and writes exactly the history rows that keeping them one at
a time (`keep_version`) writes: the same rows, in the same order, with the same versions
and provenance. Two devices pull the same changes, one through the page keeper, the other
with it reading nothing ahead (every version kept by `keep_version` itself)."""

from __future__ import annotations

from typing import Any

import pytest

from engram_sync.client._vault import history, local_writes
from engram_sync.client._vault import store as local_store
from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add, edit

_COMPARED = (
    "memory_id, version, deleted, layer, source, privacy_level, content, context, tags,"
    " modified_at, links, embedding, written_by, written_label, written_source, written_tool,"
    " written_at, new_by, new_label, new_source, new_tool, new_at, new_modified_at, reason,"
    " size, capped"
)


def _rows(device: DeviceHandle) -> list[tuple[Any, ...]]:
    with device.open() as session:
        own = session.device.device_id
        rows = session.vault.conn.execute(
            f"SELECT {_COMPARED} FROM sync_history ORDER BY seq"
        ).fetchall()
        capped = history.capped_bytes(session.vault.conn)
    same = [tuple("OWN" if v == own else v for v in row) for row in rows]
    return [*same, ("capped_bytes", capped)]


def _link(device: DeviceHandle, source: str, target: str) -> None:
    with device.open() as session, session.vault.transaction() as conn:
        conn.execute(
            "INSERT INTO engram_links (source_id, target_id, weight, link_type)"
            " VALUES (?, ?, 0.5, 'associative')",
            (source, target),
        )
        local_store.edit_memory(conn, source, f"{source} links to {target}")


def delete(device: DeviceHandle, memory_id: str) -> None:
    """A deletion that keeps the version it deletes (as `Vault.delete`)."""
    with device.open() as session, session.vault.transaction() as conn:
        own = session.device.device_id
        assert local_writes.delete(conn, memory_id, session.writer(), own_device=own)


def _pull(device: DeviceHandle, *, ahead: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        if not ahead:  # nothing read ahead: every version through keep_version
            patch.setattr(history.PageKeeper, "_stage", lambda self: {})
        device.sync()


def test_a_page_keeps_the_same_rows_as_one_version_at_a_time(
    devices: list[DeviceHandle], monkeypatch: pytest.MonkeyPatch
) -> None:
    alpha, bravo, charlie = devices
    ids = [add(alpha, f"memory {n}") for n in range(12)]
    _link(alpha, ids[0], ids[1])  # a linked memory: kept one at a time on both
    alpha.sync()
    bravo.sync()
    charlie.sync()
    steps: list[Any] = [
        lambda: [edit(alpha, m, f"{m} edited") for m in ids[2:8]],
        lambda: [delete(alpha, m) for m in ids[6:10]],
        lambda: delete(alpha, ids[1]),  # its deletion cascades the link of ids[0] away ...
        lambda: edit(alpha, ids[0], "the source, edited after"),  # ... in the same page
        lambda: [edit(alpha, m, f"{m} again") for m in ids[2:5]],
    ]
    for step in steps:
        step()
        alpha.sync()
        if step is steps[2]:
            continue  # bravo and charlie pull steps 3 and 4 as one page
        _pull(bravo, ahead=True, monkeypatch=monkeypatch)
        _pull(charlie, ahead=False, monkeypatch=monkeypatch)
    with alpha.open() as session:  # bring the deleted ones back (replacing deletions)
        writer = session.writer()
        with session.vault.transaction() as conn:
            for m in ids[6:10]:
                history.undelete(conn, m, writer, own_device=session.device.device_id)
    alpha.sync()
    _pull(bravo, ahead=True, monkeypatch=monkeypatch)
    _pull(charlie, ahead=False, monkeypatch=monkeypatch)

    kept = _rows(bravo)
    assert kept == _rows(charlie)
    reasons = [row[23] for row in kept[:-1]]
    assert reasons.count("pull") == 6 + 1 + 3 + 4  # edits, the source, again, undeletes
    assert reasons.count("pull-delete") == 4 + 1
    assert any(row[2] == 1 for row in kept[:-1])  # a deletion's marker replaced
