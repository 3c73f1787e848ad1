"""Concurrent offline edits converge, and the losing local edit is kept (PROTOCOL §8)."""

from __future__ import annotations

import json

from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add, conflicts, contents, delete, edit, sync_all


def test_concurrent_edits_converge_and_the_loser_is_kept(devices: list[DeviceHandle]) -> None:
    alpha, bravo, charlie = devices
    memory_id = add(alpha, "original")
    sync_all(alpha, bravo, charlie)

    edit(alpha, memory_id, "alpha's version")  # both offline ...
    edit(bravo, memory_id, "bravo's version")
    alpha.sync()  # ... alpha reconnects first and wins
    report = bravo.sync()
    assert report.conflicts == 1
    sync_all(alpha, bravo, charlie)

    winner = {d.name: contents(d)[memory_id] for d in devices}
    assert set(winner.values()) == {"alpha's version"}
    kept = conflicts(bravo)
    assert [(m, json.loads(text)["content"]) for m, text in kept] == [
        (memory_id, "bravo's version")
    ]
    assert conflicts(alpha) == []  # the winner lost nothing
    assert conflicts(charlie) == []  # a device without local edits has nothing to keep


def test_local_delete_losing_to_remote_edit_is_kept(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    memory_id = add(alpha, "keep me?")
    sync_all(alpha, bravo)
    edit(alpha, memory_id, "edited while bravo deleted it")
    delete(bravo, memory_id)
    alpha.sync()
    assert bravo.sync().conflicts == 1
    sync_all(alpha, bravo)
    assert contents(bravo)[memory_id] == "edited while bravo deleted it"
    ((kept_id, kept_text),) = conflicts(bravo)
    assert kept_id == memory_id
    assert json.loads(kept_text) == {"deleted": True, "id": memory_id}


def test_remote_delete_beats_unpushed_edit_and_the_edit_is_kept(
    devices: list[DeviceHandle],
) -> None:
    alpha, bravo, _ = devices
    memory_id = add(alpha, "shared")
    sync_all(alpha, bravo)
    delete(alpha, memory_id)
    edit(bravo, memory_id, "bravo edited it offline")
    alpha.sync()
    assert bravo.sync().conflicts == 1
    sync_all(alpha, bravo)
    assert memory_id not in contents(alpha)
    assert memory_id not in contents(bravo)
    assert [json.loads(t)["content"] for _, t in conflicts(bravo)] == ["bravo edited it offline"]


def test_restore_brings_the_kept_version_back_everywhere(devices: list[DeviceHandle]) -> None:
    from engram_sync.client._render import conflict_line
    from engram_sync.client._vault import conflicts as conflict_ops

    alpha, bravo, _ = devices
    memory_id = add(alpha, "v1")
    sync_all(alpha, bravo)
    edit(alpha, memory_id, "alpha v2")
    edit(bravo, memory_id, "bravo v2")
    alpha.sync()
    bravo.sync()
    with bravo.open() as session, session.vault.transaction() as conn:
        (conflict,) = conflict_ops.list_conflicts(conn)
        assert conflict.local_content == "bravo v2"
        assert not conflict.kept_out  # a local version that lost (strict_local: hostile/)
        assert "lost to " in conflict_line(conflict)
        own = session.device.device_id
        conflict_ops.restore_conflict(conn, conflict.id, session.writer(), own)
        assert conflict_ops.list_conflicts(conn) == []
    sync_all(bravo, alpha)
    assert contents(alpha)[memory_id] == contents(bravo)[memory_id] == "bravo v2"
