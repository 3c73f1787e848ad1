"""A vault at rest: directory 0700, every file 0600, whatever the umask (issue 13 item 9)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_sync.client._session import VaultSession
from engram_sync.client._vault import store as local_store
from tests.e2e.conftest import PASSPHRASE
from tests.relay.conftest import ADMIN_KEY, Relay

BIN = Path(sys.executable).parent


def modes(path: Path) -> dict[str, int]:
    found = {".": stat.S_IMODE(path.stat().st_mode)}
    for entry in path.iterdir():
        found[entry.name] = stat.S_IMODE(entry.stat().st_mode)
    return found


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_a_vault_made_and_synced_under_umask_000_is_private(
    tmp_path: Path, relay: Relay, open_umask: None
) -> None:
    path = tmp_path / "vault"
    with VaultSession.open(path, PASSPHRASE, create=True) as session:
        session.link(relay.url, ADMIN_KEY, "modes", "laptop")
        with session.vault.transaction() as conn:
            local_store.add_memory(conn, "private")
        with session.relay() as client:
            session.syncer(client).sync()
        found = modes(path)  # while open: the -wal/-shm files exist too
    assert found.pop(".") == 0o700
    assert {"engrams.db", "device.json", "sync_state.json", "salt"} <= set(found)
    assert found == dict.fromkeys(found, 0o600)


def test_the_cli_init_under_umask_000_is_private(tmp_path: Path) -> None:
    path = tmp_path / "cli-vault"
    env = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE)
    subprocess.run(
        ["sh", "-c", f'umask 000 && "{BIN / "engram-sync"}" --vault "{path}" init'],
        env=env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    found = modes(path)
    assert found.pop(".") == 0o700
    assert "engrams.db" in found
    assert found == dict.fromkeys(found, 0o600)


def test_opening_a_loose_vault_tightens_it_and_leaves_tight_files_alone(tmp_path: Path) -> None:
    path = tmp_path / "old-vault"
    VaultSession.open(path, PASSPHRASE, create=True).close()
    os.chmod(path, 0o755)
    os.chmod(path / "engrams.db", 0o644)
    (path / "notes.txt").write_text("x")
    os.chmod(path / "notes.txt", 0o400)  # tighter than 0600: kept as it is
    VaultSession.open(path, PASSPHRASE).close()
    found = modes(path)
    assert found["."] == 0o700
    assert found["engrams.db"] == 0o600
    assert found["notes.txt"] == 0o400
