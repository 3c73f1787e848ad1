"""`engram-sync watch` syncs continuously and stops cleanly; the vault id is chosen as
PROTOCOL §2 says (pinned, else derived v2, probing for an existing v1 vault)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engram_sync.client._errors import AuthError
from engram_sync.client._http.relay_client import RelayClient
from engram_sync.client._session import VaultSession, choose_vault_id
from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.sync_keys import derive_sync_keys, vault_id_v1, vault_id_v2
from tests.e2e.conftest import PASSPHRASE, VAULT_ID, DeviceHandle
from tests.e2e.helpers import add, contents
from tests.relay.conftest import ADMIN_KEY, Relay

BIN = Path(sys.executable).parent


def test_watch_syncs_until_sigterm(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    alpha.restart()  # the CLI process opens the vault itself
    env = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE)
    proc = subprocess.Popen(
        [str(BIN / "engram-sync"), "--vault", str(alpha.path), "watch", "--interval", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        memory_id = add(bravo, "appears on alpha while it watches")
        bravo.sync()
        bravo.restart()
        deadline = time.monotonic() + 60
        while True:
            held = contents(alpha)
            alpha.restart()  # close again: the watching process owns the vault
            if memory_id in held:
                break
            assert time.monotonic() < deadline, "watch never applied the new memory"
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stopped" in err
    assert "applied 1" in out


def test_vault_id_pinned_derived_and_probed(tmp_path: Path, relay: Relay) -> None:
    v1, v2 = vault_id_v1(PASSPHRASE), vault_id_v2(PASSPHRASE)
    assert choose_vault_id(PASSPHRASE, None) == v2  # no relay, no key: v2
    with RelayClient(relay.url, ADMIN_KEY) as client:
        assert choose_vault_id(PASSPHRASE, client) == v2  # nothing anywhere: v2
        # an existing legacy (v1) vault with blobs is found and kept
        blob = BlobCipher(derive_sync_keys(PASSPHRASE)).seal(
            "legacy", vault_id=v1, memory_id="mem_legacy", device_id="old", vector_clock=1,
            deleted=False,
        )  # fmt: skip
        assert client.push(v1, [blob]).accepted == 1
        assert choose_vault_id(PASSPHRASE, client) == v1
    with (
        RelayClient(relay.url, "not-a-valid-key-at-all") as bad,
        pytest.raises(AuthError, match="API key"),
    ):
        choose_vault_id(PASSPHRASE, bad)

    with VaultSession.open(tmp_path / "probe", PASSPHRASE, create=True) as session:
        assert session.link(relay.url, ADMIN_KEY, None, "probe") == v1  # probed and pinned
        assert session.config.vault_id == v1
    with VaultSession.open(tmp_path / "pinned", PASSPHRASE, create=True) as session:
        assert session.link(relay.url, ADMIN_KEY, VAULT_ID, "pinned") == VAULT_ID
