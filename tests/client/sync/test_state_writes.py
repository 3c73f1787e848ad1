"""How often a sync writes sync_state.json (issue 36: each write is two fsyncs, a large
part of a one-memory sync), on real SQLCipher vaults through a real relay: a sync that
pulls one page writes it once, at its end; a pull outside a sync (a re-key's) still
saves its cursor itself; a sync of several pages saves each page's cursor but the last.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_sync.client._session import VaultSession
from engram_sync.client._sync import state as state_module
from engram_sync.client._sync.reports import SyncReport
from engram_sync.client._sync.state import SyncState
from engram_sync.client._vault import store as local_store
from tests.relay.conftest import ADMIN_KEY, Relay

PASSPHRASE = "state write tests: correct horse battery staple"
VAULT_ID = "vault-state-writes"


@pytest.fixture
def pair(tmp_path: Path, relay: Relay) -> Iterator[tuple[VaultSession, VaultSession]]:
    opened = []
    try:
        for name in ("alpha", "bravo"):
            session = VaultSession.open(tmp_path / name, PASSPHRASE, create=True)
            opened.append(session)
            session.link(relay.url, ADMIN_KEY, VAULT_ID, name)
        yield opened[0], opened[1]
    finally:
        for session in opened:
            session.close()


@pytest.fixture
def cursors_written(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The cursor of every sync_state.json write."""
    written: list[int] = []
    real = state_module.write_json_atomic

    def counting(path: Path, payload: Any, mode: int = 0o600, **how: bool) -> bytes:
        written.append(int(payload["cursor"]))
        return real(path, payload, mode, **how)

    monkeypatch.setattr(state_module, "write_json_atomic", counting)
    return written


def _add_and_push(alpha: VaultSession, count: int) -> None:
    with alpha.vault.transaction() as conn:
        for i in range(count):
            local_store.add_memory(conn, f"state write {i}")
    with alpha.relay() as relay:
        alpha.syncer(relay).sync()


def test_a_sync_that_pulls_one_page_writes_its_state_once(
    pair: tuple[VaultSession, VaultSession], cursors_written: list[int]
) -> None:
    alpha, bravo = pair
    _add_and_push(alpha, 1)
    with bravo.relay() as relay:
        syncer = bravo.syncer(relay)
        syncer.sync()  # the first: binds, checks the digest
        _add_and_push(alpha, 1)
        cursors_written.clear()
        report = syncer.sync()
    assert report.applied == 1
    assert len(cursors_written) == 1  # the sync's own save, the page's cursor in it
    assert SyncState.load(bravo.state.path.parent).cursor == report.cursor == 2


def test_pages_but_the_last_are_saved_as_they_come_and_a_bare_pull_saves_its_own(
    pair: tuple[VaultSession, VaultSession], cursors_written: list[int]
) -> None:
    alpha, bravo = pair
    _add_and_push(alpha, 9)
    with bravo.relay() as relay:
        cursors_written.clear()
        bravo.syncer(relay, pull_page=4).sync()
        assert cursors_written[:2] == [4, 8]  # each page but the last, then the sync's end
        assert cursors_written[-1] == 9
        _add_and_push(alpha, 2)
        cursors_written.clear()
        bravo.syncer(relay, check_digest=False).pull(SyncReport())  # as a re-key's step 1
    assert cursors_written == [11]
    assert SyncState.load(bravo.state.path.parent).cursor == 11
