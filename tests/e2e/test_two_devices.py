"""Memories created, edited and deleted on one device appear on the others (issue 4)."""

from __future__ import annotations

import json

from engram_sync.client._vault import store as local_store
from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add, contents, delete, edit, sync_all


def test_create_edit_delete_propagate(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    memory_id = add(alpha, "Deploy with `make ship`", tags=["ops"], project="engram")
    assert memory_id not in contents(bravo)

    report = alpha.sync()
    assert report.pushed == 1
    report = bravo.sync()
    assert report.applied == 1
    assert contents(bravo)[memory_id] == "Deploy with `make ship`"
    with bravo.open() as session:
        memory = local_store.get_memory(session.vault.conn, memory_id)
        row = local_store.get_row(session.vault.conn, memory_id)
    assert memory is not None
    assert row is not None
    assert memory.tags == ["ops"]
    assert memory.project == "engram"
    assert row["synced_at"] == row["modified_at"]  # applied as received, not echoed back

    edit(bravo, memory_id, "Deploy with `make ship-it`")
    assert bravo.sync().pushed == 1
    alpha.sync()
    assert contents(alpha)[memory_id] == "Deploy with `make ship-it`"

    delete(alpha, memory_id)
    assert alpha.sync().pushed == 1
    bravo.sync()
    assert memory_id not in contents(bravo)
    with bravo.open() as session:
        tombstones = session.vault.conn.execute("SELECT count(*) FROM tombstones").fetchone()[0]
    assert tombstones == 0  # a remote deletion writes no local tombstone


def test_three_devices_converge(devices: list[DeviceHandle]) -> None:
    ids = [add(device, f"note from {device.name}") for device in devices]
    sync_all(*devices)
    expected = contents(devices[0])
    assert set(expected) == set(ids)
    for device in devices[1:]:
        assert contents(device) == expected


def test_second_sync_is_quiet(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    add(alpha, "one")
    sync_all(alpha, bravo)
    again = bravo.sync()
    assert (again.pushed, again.applied, again.conflicts) == (0, 0, 0)
    again = alpha.sync()
    assert (again.pushed, again.applied, again.conflicts) == (0, 0, 0)


def test_links_and_embeddings_travel(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    first = add(alpha, "cause")
    second = add(alpha, "effect")
    with alpha.open() as session, session.vault.transaction() as conn:
        conn.execute(
            "INSERT INTO engram_links (source_id, target_id, weight, link_type)"
            " VALUES (?, ?, 0.9, 'causal')",
            (second, first),
        )
        conn.execute(
            "INSERT INTO engram_embeddings (engram_id, embedding, model, dimensions, created_at)"
            " VALUES (?, ?, 'm', 2, '2026-01-01T00:00:00+00:00')",
            (first, b"\x00" * 8 + b"\x00\x00\x00\x00\x00\x00\xf0\x3f"),
        )
        local_store.mark_edited(conn, first, local_store.next_modified_at())
        local_store.mark_edited(conn, second, local_store.next_modified_at())
    alpha.sync()
    bravo.sync()
    with bravo.open() as session:
        linked = local_store.get_memory(session.vault.conn, second)
        embedded = local_store.get_memory(session.vault.conn, first)
    assert linked is not None
    assert embedded is not None
    assert [(link.target_id, link.link_type, link.weight) for link in linked.links] == [
        (first, "causal", 0.9)
    ]
    assert embedded.embedding == [0.0, 1.0]
    assert json.loads(local_store.encode_memory(embedded))["embedding_model"] == "m"
