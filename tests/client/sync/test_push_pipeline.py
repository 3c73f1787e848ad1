"""A sync's push seals the next batch while the relay answers the one sent
(client._sync.push_pipeline, issue 36), on a real SQLCipher vault and a real relay: the
batches still reach the relay one at a time, in edit order, each memory once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_sync.client._http.relay_client import RelayClient
from engram_sync.client._session import VaultSession
from engram_sync.client._vault import store as local_store
from engram_sync.shared_format.wire import PushResponse, SyncBlob
from tests.relay.conftest import ADMIN_KEY, Relay

PASSPHRASE = "push pipeline tests: correct horse battery staple"
VAULT_ID = "vault-push-pipeline"
BATCH = 40


class WaitingRelayClient(RelayClient):
    """A real relay client whose first push waits (up to 5 s) until the device has sealed
    the next batch (its clock reserved past the first batch's), then sends."""

    def __init__(self, session: VaultSession) -> None:
        assert session.config.server_url is not None
        super().__init__(
            session.config.server_url, session.config.api_key, device_id=session.device.device_id
        )
        self.session = session
        self.sealed_ahead: list[bool] = []
        self.batches: list[list[str]] = []
        self.concurrent = 0
        self.most_concurrent = 0
        self._lock = threading.Lock()

    def push(self, vault_id: str, blobs: list[SyncBlob]) -> PushResponse:
        with self._lock:
            self.concurrent += 1
            self.most_concurrent = max(self.most_concurrent, self.concurrent)
            self.batches.append([b.memory_id for b in blobs])
        try:
            if len(self.batches) == 1:
                last = blobs[-1].vector_clock
                for _ in range(500):  # the device's clock: read, never written, here
                    if self.session.device.vector_clock > last:
                        break
                    threading.Event().wait(0.01)
                self.sealed_ahead.append(self.session.device.vector_clock > last)
            return super().push(vault_id, blobs)
        finally:
            with self._lock:
                self.concurrent -= 1


@pytest.fixture
def alpha(tmp_path: Path, relay: Relay) -> Iterator[VaultSession]:
    session = VaultSession.open(tmp_path / "alpha", PASSPHRASE, create=True)
    try:
        session.link(relay.url, ADMIN_KEY, VAULT_ID, "alpha")
        yield session
    finally:
        session.close()


def test_the_next_batch_is_sealed_while_one_is_pushed_and_batches_go_one_at_a_time(
    alpha: VaultSession,
) -> None:
    with alpha.vault.transaction() as conn:
        ids = [local_store.add_memory(conn, f"pipelined {i}") for i in range(5 * BATCH)]
    expected = [
        row[0]
        for row in alpha.vault.conn.execute(
            f"SELECT id FROM engrams WHERE {local_store.NEEDS_PUSH}"
            " ORDER BY coalesce(modified_at, ''), id"
        )
    ]
    client = WaitingRelayClient(alpha)
    with client:
        report = alpha.syncer(client, push_batch=BATCH).sync()
    assert client.sealed_ahead == [True]  # batch 2 sealed before batch 1's answer
    assert client.most_concurrent == 1  # one push at a time
    assert [m for batch in client.batches for m in batch] == expected  # edit order, once
    assert report.pushed == len(ids)
    assert local_store.count_to_push(alpha.vault.conn) == (0, 0)
