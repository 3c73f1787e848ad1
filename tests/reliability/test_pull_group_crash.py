"""A device killed while a group of pulled pages is open (client._sync.page_group, issue
36): nothing of the open group is kept, the cursor on disk is the last COMMIT's, every
memory below it is on the device, and the next sync takes the rest with a right digest.

A device process pulls 12 memories in pages of 3, two pages a transaction, and kills
itself (os._exit, no cleanup) right after the third page is applied: the second group
is open, its first page written but not committed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from engram_sync.client._session import VaultSession
from engram_sync.client._sync.state import SyncState
from engram_sync.client._vault import store as local_store
from engram_sync.client._vault.held_versions import held_versions
from engram_sync.client._vault.kept_digest import kept_digest
from engram_sync.shared_format.digest import fold
from tests.relay.conftest import ADMIN_KEY
from tests.reliability.support import RelayProcess

PASSPHRASE = "pull group crash passphrase"
VAULT = "pull-group-crash"

PULLER = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from engram_sync.client._session import VaultSession
    from engram_sync.client._sync import page_group
    from engram_sync.client._sync.page_group import GroupBound

    real = page_group.PageGroup.applied
    calls = []

    def applied(self, **page):
        real(self, **page)
        calls.append(page["cursor"])
        if len(calls) == 3:
            os._exit(9)  # killed: the open group is neither committed nor rolled back

    page_group.PageGroup.applied = applied
    bound = GroupBound(memories=6, ciphertext=10**9, seconds=3600.0, grouped_page=1)
    with VaultSession.open(Path(sys.argv[1]), sys.argv[2]) as session:
        with session.relay() as relay:
            session.syncer(relay, pull_page=3, group_bound=bound).sync()
    """
)


def test_a_device_killed_inside_a_group_keeps_only_committed_pages(
    relay_process: RelayProcess, tmp_path: Path
) -> None:
    writer, reader = tmp_path / "writer", tmp_path / "reader"
    with VaultSession.open(writer, PASSPHRASE, create=True) as session:
        session.link(relay_process.url, ADMIN_KEY, VAULT, "writer")
        with session.vault.transaction() as conn:
            ids = [local_store.add_memory(conn, f"pulled before a kill {i}") for i in range(12)]
        with session.relay() as client:
            assert session.syncer(client).sync().pushed == 12
    with VaultSession.open(reader, PASSPHRASE, create=True) as session:
        session.link(relay_process.url, ADMIN_KEY, VAULT, "reader")

    done = subprocess.run(
        [sys.executable, "-c", PULLER, str(reader), PASSPHRASE],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 9, done.stderr

    assert SyncState.load(reader).cursor == 6  # the first group's COMMIT, not the 3rd page
    with VaultSession.open(reader, PASSPHRASE) as session:
        held = {m.id for m in local_store.list_memories(session.vault.conn)}
        assert held == set(ids[:6])  # in push order: seq 1-6
        with session.relay() as client:
            report = session.syncer(client).sync()
        assert report.applied == 6
        assert {m.id for m in local_store.list_memories(session.vault.conn)} == set(ids)
        kept = kept_digest(session.vault)
        with session.vault.transaction() as conn:
            assert kept == fold(held_versions(conn))
        assert report.digest is not None
        assert report.digest.matched
