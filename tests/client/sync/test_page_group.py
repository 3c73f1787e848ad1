"""Several pulled pages in one transaction (client._sync.page_group, issue 36), and the
next page asked for while one is applied (client._sync.ask_ahead), on real SQLCipher
vaults through a real relay: the cursor is saved only with committed rows, an error
between pages keeps the pages before it, an error inside a page keeps nothing of its
group, and what a grouped pull leaves is what a page-by-page pull leaves.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_sync.client._errors import RelayUnavailableError
from engram_sync.client._session import VaultSession
from engram_sync.client._sync import engine as engine_module
from engram_sync.client._sync.page_group import GroupBound, group_full
from engram_sync.client._sync.state import SyncState
from engram_sync.client._vault import store as local_store
from engram_sync.client._vault.held_versions import held_versions
from engram_sync.client._vault.kept_digest import kept_digest
from engram_sync.shared_format.digest import fold
from tests.client.sync.test_state_writes import cursors_written as cursors_written
from tests.relay.conftest import ADMIN_KEY, Relay

PASSPHRASE = "page group tests: correct horse battery staple"
VAULT_ID = "vault-page-group"
# pages of 3, grouped from 1 blob a page, committed at 6 blobs: 12 memories are 4 pages,
# committed after the 2nd and the 4th
PAGE = 3
BOUND = GroupBound(memories=6, ciphertext=10**9, seconds=3600.0, grouped_page=1)


def test_a_group_commits_at_its_bounds_and_a_small_page_at_once() -> None:
    bound = GroupBound(memories=10, ciphertext=100, seconds=1.0, grouped_page=4)
    under = {"memories": 9, "ciphertext": 99, "seconds": 0.5, "last_page": 4}
    assert not group_full(bound, **under)
    for name, value in (("memories", 10), ("ciphertext", 100), ("seconds", 1.0)):
        assert group_full(bound, **{**under, name: value}), name
    assert group_full(bound, **{**under, "last_page": 3})  # a small page is not grouped


@pytest.fixture
def pair(tmp_path: Path, relay: Relay) -> Iterator[tuple[VaultSession, VaultSession]]:
    opened = []
    try:
        for name in ("alpha", "bravo"):
            session = VaultSession.open(tmp_path / name, PASSPHRASE, create=True)
            opened.append(session)
            session.link(relay.url, ADMIN_KEY, VAULT_ID, name)
        alpha = opened[0]
        with alpha.vault.transaction() as conn:
            for i in range(12):
                local_store.add_memory(conn, f"grouped page memory {i}")
        with alpha.relay() as client:
            assert alpha.syncer(client).sync().pushed == 12
        yield opened[0], opened[1]
    finally:
        for session in opened:
            session.close()


def _the_next_sync_brings_the_rest(bravo: VaultSession) -> None:
    """After a pull that kept 6 of the 12: a sync pulls the other 6, the kept digest right."""
    with bravo.relay() as client:
        report = bravo.syncer(client, pull_page=PAGE).sync()
    assert report.applied == 6
    assert _held(bravo) == 12
    assert _kept_is_right(bravo)


def _held(session: VaultSession) -> int:
    return int(session.vault.conn.execute("SELECT count(*) FROM engrams").fetchone()[0])


def _kept_is_right(session: VaultSession) -> bool:
    """The kept digest (folded at each group's COMMIT) is the one of the rows held."""
    kept = kept_digest(session.vault)
    with session.vault.transaction() as conn:
        return kept == fold(held_versions(conn))


def _saved_cursor(session: VaultSession) -> int:
    return SyncState.load(session.state.path.parent).cursor


def test_pages_of_a_group_commit_together_and_the_cursor_follows_each_commit(
    pair: tuple[VaultSession, VaultSession], cursors_written: list[int]
) -> None:
    _, bravo = pair
    with bravo.relay() as client:
        report = bravo.syncer(client, pull_page=PAGE, group_bound=BOUND).sync()
    assert report.applied == 12
    assert cursors_written[0] == 6  # after the first group's COMMIT, not after each page
    assert cursors_written[-1] == 12
    assert _kept_is_right(bravo)


def test_an_error_between_pages_keeps_the_pages_before_it(
    pair: tuple[VaultSession, VaultSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, bravo = pair
    calls: list[int] = []
    real = engine_module.Syncer._fetch

    def failing_third(self: engine_module.Syncer, ask: Any) -> Any:
        calls.append(ask.cursor)
        if len(calls) == 3:  # the page after cursor 6: pages 1-2 applied, one group
            raise RelayUnavailableError("the relay went away (test)", url=self.relay.base_url)
        return real(self, ask)

    monkeypatch.setattr(engine_module.Syncer, "_fetch", failing_third)
    big = GroupBound(memories=100, ciphertext=10**9, seconds=3600.0, grouped_page=1)
    with bravo.relay() as client, pytest.raises(RelayUnavailableError):
        bravo.syncer(client, pull_page=PAGE, group_bound=big).sync()
    assert _saved_cursor(bravo) == 6
    assert _held(bravo) == 6
    monkeypatch.setattr(engine_module.Syncer, "_fetch", real)
    _the_next_sync_brings_the_rest(bravo)


def test_an_error_inside_a_page_keeps_nothing_of_its_group(
    pair: tuple[VaultSession, VaultSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, bravo = pair
    pages: list[int] = []
    real = engine_module.fresh_ids

    def failing_fourth(conn: Any, memory_ids: Any) -> set[str]:
        pages.append(len(memory_ids))
        if len(pages) == 4:  # inside the second group's second page, in its transaction
            local_store.add_memory(conn, "written by the page that fails")
            raise RuntimeError("the disk went away (test)")
        return real(conn, memory_ids)

    monkeypatch.setattr(engine_module, "fresh_ids", failing_fourth)
    with bravo.relay() as client, pytest.raises(RuntimeError):
        bravo.syncer(client, pull_page=PAGE, group_bound=BOUND).sync()
    # the first group (6) committed; the second's page 3 and the failing page 4 are not
    assert _saved_cursor(bravo) == 6
    assert _held(bravo) == 6
    assert _kept_is_right(bravo)
    monkeypatch.setattr(engine_module, "fresh_ids", real)
    _the_next_sync_brings_the_rest(bravo)


def test_ctrl_c_during_a_pull_does_not_wait_for_the_page_asked_ahead(
    pair: tuple[VaultSession, VaultSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A person's Ctrl-C while a page is applied ends the sync at once even when the next
    page, asked ahead, never comes back (a hung relay); nothing of that group is kept."""
    _, bravo = pair
    release = threading.Event()
    calls: list[int] = []
    real_fetch = engine_module.Syncer._fetch
    real_fresh = engine_module.fresh_ids

    def hanging_second(self: engine_module.Syncer, ask: Any) -> Any:
        calls.append(ask.cursor)
        if len(calls) == 2:  # the page asked ahead while page 1 is applied
            release.wait()
        return real_fetch(self, ask)

    def interrupted(conn: Any, memory_ids: Any) -> set[str]:
        if calls == [0, 3]:  # page 1 applied while page 2 hangs: the person presses Ctrl-C
            raise KeyboardInterrupt
        return real_fresh(conn, memory_ids)

    monkeypatch.setattr(engine_module.Syncer, "_fetch", hanging_second)
    monkeypatch.setattr(engine_module, "fresh_ids", interrupted)
    watchdog = threading.Timer(30, release.set)  # a sync that waits ends only by this
    watchdog.start()
    try:
        with bravo.relay() as client, pytest.raises(KeyboardInterrupt):
            bravo.syncer(client, pull_page=PAGE, group_bound=BOUND).sync()
        assert not release.is_set(), "the interrupted sync waited for the hung page"
    finally:
        watchdog.cancel()
        release.set()
    assert _saved_cursor(bravo) == 0  # page 1's group never committed
    assert _held(bravo) == 0
