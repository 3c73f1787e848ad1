"""The local history (docs/history.md): every replaced version kept once, retention in
bounded steps, the revert decision, and nothing of it leaving the device. Real SQLCipher
vaults; where a pull is the replacing write, a real relay over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engram_sync.client import HistoryError, Retention, Vault
from engram_sync.client._session import VaultSession
from engram_sync.client._vault import history, local_writes
from engram_sync.client._vault.conflicts import list_conflicts, restore_conflict
from engram_sync.client._vault.revert import KeptVersion, Selector, Step, Unrevertible, plan_memory
from engram_sync.client._vault.transfer import export_lines
from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.timestamps import parse_rfc3339
from tests.relay.conftest import ADMIN_KEY, Relay

PASSPHRASE = "history correct horse battery staple"


def _reasons(session: VaultSession, memory_id: str) -> list[str]:
    rows = session.vault.conn.execute(
        "SELECT reason FROM sync_history WHERE memory_id = ? ORDER BY seq", (memory_id,)
    ).fetchall()
    return [str(r[0]) for r in rows]


def _open(path: Path) -> VaultSession:
    return VaultSession.open(path, PASSPHRASE, create=True)


def _sync(session: VaultSession) -> None:
    with session.relay(max_retries=1, backoff_base=0) as client:
        session.syncer(client).sync()


def test_every_way_a_version_is_replaced_keeps_one_row(tmp_path: Path, relay: Relay) -> None:
    a, b = _open(tmp_path / "a"), _open(tmp_path / "b")
    try:
        for session, label in ((a, "a"), (b, "b")):
            session.link(relay.url, ADMIN_KEY, "history-every-way", label)
        va, vb = Vault(a), Vault(b)
        memory_id = va.add("first")
        assert _reasons(a, memory_id) == []  # a first version replaces nothing
        _sync(a)
        _sync(b)
        assert _reasons(b, memory_id) == []  # nor does a first pull
        steps: list[tuple[VaultSession, str, object]] = [
            (a, "edit", lambda: va.edit(memory_id, "second")),
            (a, "edit", lambda: va.edit(memory_id, privacy_level="hybrid")),
            (b, "pull", lambda: (_sync(a), _sync(b))),
            (b, "delete", lambda: vb.delete(memory_id)),
            (a, "pull-delete", lambda: (_sync(b), _sync(a))),
            (a, "undelete", lambda: va.undelete(memory_id)),
            (a, "restore", lambda: va.restore(memory_id, 1)),
        ]
        for session, reason, step in steps:
            before = _reasons(session, memory_id)
            step()  # type: ignore[operator]
            assert _reasons(session, memory_id) == [*before, reason], reason
        # a pulled version that beats a local edit not pushed: kept once in the history
        # (and once as a conflict copy); restoring the conflict copy keeps one more
        _sync(a)
        _sync(b)  # b holds "first" again (the restore), deletion replaced: a pull
        assert _reasons(b, memory_id)[-1] == "pull"
        va.edit(memory_id, "a wins")
        vb.edit(memory_id, "b loses")
        _sync(a)
        before = _reasons(b, memory_id)
        _sync(b)
        assert _reasons(b, memory_id) == [*before, "pull"]
        (conflict,) = list_conflicts(b.vault.conn)
        with b.vault.transaction() as conn:
            restore_conflict(conn, conflict.id, b.writer(), b.device.device_id)
        assert _reasons(b, memory_id) == [*before, "pull", "conflict"]
        assert vb.get(memory_id).content == "b loses"  # type: ignore[union-attr]
        # a revert of a's writes on b selects nothing: b's own version is current
        before = _reasons(b, memory_id)
        vb.revert(device=a.device.device_id)
        assert _reasons(b, memory_id) == before
        # b's version reaches a: one row; the next sync (nothing newer) replaces nothing
        _sync(b)
        before = _reasons(a, memory_id)
        _sync(a)
        _sync(a)
        assert _reasons(a, memory_id) == [*before, "pull"]
        # a revert of b's writes on a: one row, and the memory is a's version again
        va.revert(device=b.device.device_id)
        assert _reasons(a, memory_id) == [*before, "pull", "revert"]
        assert va.get(memory_id).content == "a wins"  # type: ignore[union-attr]
    finally:
        a.close()
        b.close()


def test_restore_and_undelete_refuse_what_is_not_kept(tmp_path: Path) -> None:
    with Vault.open(tmp_path / "v", PASSPHRASE, create=True) as vault:
        memory_id = vault.add("only version")
        with pytest.raises(HistoryError, match="not deleted"):
            vault.undelete(memory_id)
        with pytest.raises(HistoryError, match="no kept version 7"):
            vault.restore(memory_id, 7)
        with pytest.raises(HistoryError, match="no earlier version"):
            vault.undelete("mem_never-here")
        vault.delete(memory_id)
        deleted_version = vault.history(memory_id)[-1]
        assert deleted_version.current
        assert deleted_version.deleted
        with pytest.raises(HistoryError):  # the current version is not a kept one
            vault.restore(memory_id, deleted_version.version)
        # nothing changed by the refusals: one version kept (the deletion's), still deleted
        assert [v.reason for v in vault.history(memory_id)] == ["delete", None]
        assert vault.get(memory_id) is None
        vault.undelete(memory_id)
        assert vault.get(memory_id).content == "only version"  # type: ignore[union-attr]


def _fill(vault: Vault, memories: int, size: int) -> list[str]:
    return [vault.add(f"memory {i} " + "x" * size) for i in range(memories)]


def test_retention_prunes_old_and_oversized_history_in_bounded_steps(tmp_path: Path) -> None:
    with Vault.open(tmp_path / "v", PASSPHRASE, create=True) as vault:
        conn = vault._session.vault.conn
        ids = _fill(vault, 20, 2000)
        vault.history_retention(Retention(keep_days=30, max_percent=10, min_bytes=0))
        for round_ in range(30):
            for memory_id in ids:
                vault.edit(memory_id, f"round {round_} " + "y" * 2000)
        cap = history.cap_bytes(conn)
        assert 0 < history.capped_bytes(conn) <= cap
        kept = conn.execute("SELECT count(*) FROM sync_history").fetchone()[0]
        assert kept < 600  # pruned: 600 versions were replaced
        # the newest versions are the ones kept; the horizon says history was cut
        assert history.horizon(conn) is not None
        newest = vault.history(ids[-1])
        assert newest[-2].memory is not None
        assert newest[-2].memory.content.startswith("round 28")
        total = sum(int(r[0]) for r in conn.execute("SELECT size FROM sync_history WHERE capped"))
        assert total == history.capped_bytes(conn)  # the running total is true

        # a deleted memory's last version is not counted against the cap...
        vault.delete(ids[0])
        trash = conn.execute(
            "SELECT capped FROM sync_history WHERE memory_id = ? ORDER BY seq DESC LIMIT 1",
            (ids[0],),
        ).fetchone()
        assert trash[0] == 0
        # ... and a cap of nothing prunes at most PRUNE_PER_WRITE rows per write
        vault.history_retention(Retention(keep_days=30, max_percent=0, min_bytes=0))
        before = conn.execute("SELECT count(*) FROM sync_history WHERE capped").fetchone()[0]
        vault.edit(ids[1], "one more")
        after = conn.execute("SELECT count(*) FROM sync_history WHERE capped").fetchone()[0]
        assert after == before + 1 - history.PRUNE_PER_WRITE
        assert (
            conn.execute("SELECT count(*) FROM sync_history WHERE NOT capped").fetchone()[0] == 1
        )  # the deletion's version stays whatever the cap

        # older than the retention days: gone oldest first, a bounded number per write
        conn.execute("UPDATE sync_history SET replaced_at = '2000-01-01T00:00:00+00:00'")
        rows = conn.execute("SELECT count(*) FROM sync_history").fetchone()[0]
        vault.edit(ids[2], "and one more")
        assert conn.execute("SELECT count(*) FROM sync_history").fetchone()[0] == (
            rows + 1 - history.PRUNE_PER_WRITE
        )
        for _ in range(rows):
            vault.edit(ids[2], "again")
        assert (
            conn.execute("SELECT count(*) FROM sync_history WHERE replaced_at < '2001'").fetchone()[
                0
            ]
            == 0
        )  # the trash too, once past the days
        with pytest.raises(HistoryError):
            vault.history_retention(Retention(keep_days=0))


_D = "device-d"
_OTHER = "device-o"


def _w(
    device: str, at: str = "2026-12-04T10:00:00+00:00", tool: str | None = None
) -> history.Writer:
    return history.Writer(device, source="user", tool=tool, at=at)


def test_plan_memory_walks_back_past_the_selected_writes() -> None:
    by_d = Selector(device_id=_D)
    origin = history.Origin(_w(_D), "pull", 4)
    kept = [
        KeptVersion(1, False, _w(_OTHER), "pull"),
        KeptVersion(2, False, _w(_D), "pull"),
        KeptVersion(3, False, _w(_D), "pull"),
    ]
    # back past every version D wrote, to the other device's version 1
    assert plan_memory("m", origin, False, kept, by_d) == Step("m", "restore", 1)
    # D deleted it: the same version comes back as an undelete
    assert plan_memory("m", origin, True, kept, by_d) == Step("m", "undelete", 1)
    # the current version is someone else's: nothing to do
    assert plan_memory("m", history.Origin(_w(_OTHER), "pull", 4), False, kept, by_d) is None
    # D created it (version 1 is D's, nothing was pruned): it goes
    created = [KeptVersion(1, False, _w(_D), "pull")]
    assert plan_memory("m", history.Origin(_w(_D), "pull", 2), False, created, by_d) == (
        Step("m", "delete")
    )
    # D created and deleted it: stays deleted
    assert plan_memory("m", history.Origin(_w(_D), "pull", 2), True, created, by_d) is None
    # the versions before D's writes were pruned: said, not guessed
    pruned = [KeptVersion(5, False, _w(_D), "pull")]
    assert plan_memory("m", history.Origin(_w(_D), "pull", 6), False, pruned, by_d) == (
        Unrevertible("m", "the versions before these writes were pruned")
    )
    # the version before D's was a deletion (D brought it back): deleted again
    resurrected = [KeptVersion(1, False, _w(_OTHER), "pull-delete"), KeptVersion(2, True,
                   _w(_OTHER), "pull")]  # fmt: skip
    assert plan_memory("m", history.Origin(_w(_D), "pull", 3), False, resurrected, by_d) == (
        Step("m", "delete")
    )
    # --since: D's writes before it are kept
    since = Selector(device_id=_D, since=parse_rfc3339("2026-12-04T12:00:00Z"))
    late = history.Origin(_w(_D, "2026-12-04T13:00:00+00:00"), "pull", 4)
    mixed = [
        KeptVersion(1, False, _w(_OTHER), "pull"),
        KeptVersion(2, False, _w(_D, "2026-12-04T11:00:00+00:00"), "pull"),
        KeptVersion(3, False, _w(_D, "2026-12-04T12:30:00+00:00"), "pull"),
    ]
    assert plan_memory("m", late, False, mixed, since) == Step("m", "restore", 2)
    # a version a revert wrote is never selected, and stops the walk back
    assert plan_memory("m", history.Origin(_w(_D), "revert", 4), False, kept, by_d) is None
    after_revert = [
        KeptVersion(1, False, _w(_OTHER), "pull"),
        KeptVersion(2, False, _w(_D), "revert"),  # replaced by a revert ...
        KeptVersion(3, False, _w(_D), "pull"),  # ... so this version is the revert's
    ]
    assert plan_memory("m", origin, False, after_revert, by_d) == Step("m", "restore", 3)
    # by tool: only the tool's versions are walked past
    by_tool = Selector(tool="rogue")
    tooled = [KeptVersion(1, False, _w(_D), "edit"), KeptVersion(2, False, _w(_D, tool="rogue"),
              "edit")]  # fmt: skip
    current = history.Origin(_w(_D, tool="rogue"), "edit", 3)
    assert plan_memory("m", current, False, tooled, by_tool) == Step("m", "restore", 1)
    with pytest.raises(ValueError, match="whose writes"):
        Selector()


def test_history_is_never_exported_or_pushed(tmp_path: Path, relay: Relay) -> None:
    secret = "old version the relay must never see"
    with Vault.open(tmp_path / "v", PASSPHRASE, create=True) as vault:
        memory_id = vault.add(secret)
        vault.edit(memory_id, "the version that syncs")
        gone = vault.add("deleted before any sync: " + secret)
        vault.delete(gone)
        assert secret in json.dumps([v.memory.content for v in vault.history(memory_id)[:1]])
        exported = "\n".join(export_lines(vault._session.vault.conn, include_deleted=True))
        assert secret not in exported
        assert "the version that syncs" in exported
        vault.link(relay.url, ADMIN_KEY, vault_id="history-never-pushed")
        vault.sync()
        session = vault._session
        with session.relay() as client:
            page = client.pull("history-never-pushed", cursor=0, limit=1000)
        cipher = BlobCipher(session.keys)
        opened = [cipher.open(blob) for blob in page.blobs]
        assert any("the version that syncs" in text for text in opened)
        assert not any(secret in text for text in opened)


def test_local_writes_keep_the_writer(tmp_path: Path) -> None:
    """Who wrote a version is what `revert --source/--tool` selects on."""
    with _open(tmp_path / "v") as session:
        with session.vault.transaction() as conn:
            from engram_sync.client._vault.store import add_memory

            memory_id = add_memory(conn, "by a person")
        tool = session.writer(source="ai-tool", tool="rogue")
        own = session.device.device_id
        with session.vault.transaction() as conn:
            assert local_writes.edit(conn, memory_id, "by a tool", None, tool, own_device=own)
        with session.vault.transaction() as conn:
            assert local_writes.delete(conn, memory_id, tool, own_device=own)
        versions = history.versions(session.vault.conn, memory_id, own)
        assert [(v.written.source, v.written.tool) for v in versions] == [
            ("user", None),
            ("ai-tool", "rogue"),
            ("ai-tool", "rogue"),  # the deletion: its writer from the row that kept it
        ]
        assert versions[-1].deleted
        assert versions[-1].current
