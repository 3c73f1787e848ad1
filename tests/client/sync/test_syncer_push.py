"""Syncer.push on real SQLCipher vaults against a real relay: batches, order, edits mid-sync.

A recording RelayClient (a real client over HTTP) notes the memory ids of every push
request, so the tests can check what was sent, in which order, and how often.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from engram_sync.client._http.relay_client import RelayClient
from engram_sync.client._session import VaultSession
from engram_sync.client._sync.reports import SyncReport
from engram_sync.client._vault import store as local_store
from engram_sync.shared_format.timestamps import format_rfc3339
from engram_sync.shared_format.wire import PushResponse, SyncBlob
from tests.relay.conftest import ADMIN_KEY, Relay

PASSPHRASE = "client push tests: correct horse battery staple"
VAULT_ID = "vault-push-tests"


class RecordingRelayClient(RelayClient):
    """A real relay client that records the memory ids of each push request."""

    def __init__(self, session: VaultSession) -> None:
        assert session.config.server_url is not None
        super().__init__(
            session.config.server_url, session.config.api_key, device_id=session.device.device_id
        )
        self.batches: list[list[str]] = []

    def push(self, vault_id: str, blobs: list[SyncBlob]) -> PushResponse:
        self.batches.append([b.memory_id for b in blobs])
        return super().push(vault_id, blobs)

    @property
    def pushed(self) -> list[str]:
        return [memory_id for batch in self.batches for memory_id in batch]


@pytest.fixture
def sessions(tmp_path: Path, relay: Relay) -> Iterator[tuple[VaultSession, VaultSession]]:
    """Two devices (alpha, bravo) with their own vaults, linked to the same relay vault."""
    opened: list[VaultSession] = []
    try:
        for name in ("alpha", "bravo"):
            session = VaultSession.open(tmp_path / name, PASSPHRASE, create=True)
            opened.append(session)
            session.link(relay.url, ADMIN_KEY, VAULT_ID, name)
        yield opened[0], opened[1]
    finally:
        for session in opened:
            session.close()


def _add(session: VaultSession, count: int, prefix: str) -> list[str]:
    with session.vault.transaction() as conn:
        return [local_store.add_memory(conn, f"{prefix} {i}") for i in range(count)]


def _contents(session: VaultSession) -> dict[str, str]:
    return {m.id: m.content for m in local_store.list_memories(session.vault.conn)}


def _push_order(session: VaultSession) -> list[str]:
    """Ids of the rows needing a push, oldest edit first (PROTOCOL §8), straight from SQL."""
    rows = session.vault.conn.execute(
        f"SELECT id FROM engrams WHERE {local_store.NEEDS_PUSH}"
        " ORDER BY coalesce(modified_at, ''), id"
    ).fetchall()
    return [r[0] for r in rows]


def test_thousands_of_memories_in_small_batches_are_each_pushed_once_oldest_edit_first(
    sessions: tuple[VaultSession, VaultSession],
) -> None:
    alpha, bravo = sessions
    ids = _add(alpha, 3000, "bulk")
    # Edit stamps in shuffled order (push order is not insertion order), with many ties,
    # which go by id.
    rng = random.Random(7)
    base = datetime(2030, 1, 1, tzinfo=UTC)
    with alpha.vault.transaction() as conn:
        conn.executemany(
            "UPDATE engrams SET modified_at = ? WHERE id = ?",
            [(format_rfc3339(base + timedelta(seconds=rng.randrange(1000))), i) for i in ids],
        )
    expected = _push_order(alpha)
    assert sorted(expected) == sorted(ids)
    assert expected != ids

    client = RecordingRelayClient(alpha)
    with client:
        report = alpha.syncer(client, push_batch=50).sync()
        assert report.pushed == 3000
        assert (report.rejected, report.oversized) == (0, [])
        assert client.pushed == expected  # every memory once, oldest edit first
        assert [len(batch) for batch in client.batches] == [50] * 60
        assert local_store.count_to_push(alpha.vault.conn) == (0, 0)

        client.batches.clear()
        assert alpha.syncer(client, push_batch=50).sync().pushed == 0
        assert client.batches == []

    with bravo.relay() as pulling:
        assert bravo.syncer(pulling).sync().applied == 3000
    assert _contents(bravo) == _contents(alpha)


@pytest.mark.parametrize("pinned", [True, False], ids=["one-batch-settled-at-a-time", "default"])
def test_rows_edited_during_a_push_are_pushed_in_the_same_sync(
    sessions: tuple[VaultSession, VaultSession], pinned: bool
) -> None:
    """`pinned`: one batch settled at a time, one sealed ahead, so the edit lands after the
    first batch's answer and before the last batch is sealed: the later row goes with its
    batch, edit included. By default a group of four answers is settled with two batches
    sealed behind it, all six by then: the later row went with its old text and goes
    again. Either way the already pushed row and the new one follow, and bravo gets
    every edit."""
    alpha, bravo = sessions
    _add(alpha, 300, "row")
    order = _push_order(alpha)
    early, late = order[0], order[-1]
    added: list[str] = []

    def edit_after_first_batch(phase: str, report: SyncReport) -> None:
        if phase == "push" and report.pushed == 50:
            with alpha.vault.transaction() as conn:
                assert local_store.edit_memory(conn, early, "edited after its push")
                assert local_store.edit_memory(conn, late, "edited during the push")
                added.append(local_store.add_memory(conn, "added during the push"))

    options = {"push_depth": 2, "settle_group": 1} if pinned else {}
    client = RecordingRelayClient(alpha)
    with client:
        report = alpha.syncer(client, edit_after_first_batch, push_batch=50, **options).sync()
        assert client.pushed[:300] == order
        if pinned:  # oldest edit first
            assert client.pushed[300:] == [early, added[0]]
        else:
            assert sorted(client.pushed[300:]) == sorted([early, late, added[0]])
        assert report.pushed == len(client.pushed) == (302 if pinned else 303)
        assert local_store.count_to_push(alpha.vault.conn) == (0, 0)

    with bravo.relay() as pulling:
        bravo.syncer(pulling).sync()
    got = _contents(bravo)
    assert got == _contents(alpha)
    assert got[early] == "edited after its push"
    assert got[late] == "edited during the push"
    assert got[added[0]] == "added during the push"
