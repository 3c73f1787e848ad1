"""The re-key's pipelined copy (client._flows.rekey, docs/rekey.md "Measured"): several
pushes of the copy are in flight at once against a real relay, every batch lands (the two
vaults' decrypted sets equal), the progress counts every version once, and a push failing
in the middle of the pipeline stops the copy, after which a rerun finishes it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engram_sync.client._errors import SyncError
from engram_sync.client._flows.rekey import Rekey
from engram_sync.client._http.relay_client import RelayClient
from engram_sync.client._session import VaultSession
from engram_sync.client._vault import store
from engram_sync.shared_format.wire import PushResponse, SyncBlob
from tests.client.flows.test_rekey import PASSPHRASE, _decrypted, _keys, _team_vault
from tests.relay.conftest import Relay

BARRIER_S = 60.0  # only a guard: the pushes meet at once when they run together


def _vault_of(path: Path, relay: Relay, vault_id: str, extra: int) -> None:
    """The team vault of tests/client/flows/test_rekey.py with `extra` more memories, synced."""
    _team_vault(path, relay, vault_id)
    with VaultSession.open(path, PASSPHRASE) as session:
        with session.vault.transaction() as conn:
            for i in range(extra):
                store.add_memory(conn, f"pipelined memory {i}")
        with session.relay() as client:
            session.syncer(client).sync()


def test_pushes_of_the_copy_are_in_flight_together_and_all_land(
    tmp_path: Path, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "laptop"
    _vault_of(path, relay, "team-pipeline", extra=10)  # 15 versions, 1 a tombstone
    real_push = RelayClient.push
    together = threading.Barrier(3, timeout=BARRIER_S)
    threads: set[str] = set()

    def push(self: RelayClient, vault_id: str, blobs: list[SyncBlob]) -> PushResponse:
        if vault_id != "team-pipeline" and len(threads) < 3:
            threads.add(threading.current_thread().name)
            together.wait()  # the first three pushes of the copy wait for each other
        return real_push(self, vault_id, blobs)

    monkeypatch.setattr(RelayClient, "push", push)
    seen: list[tuple[int, int]] = []
    with VaultSession.open(path, PASSPHRASE) as session:
        before = _decrypted(relay, "team-pipeline", _keys(session, "team-pipeline"))
        report = Rekey(
            session, push_batch=2, push_concurrency=3, progress=lambda d, t: seen.append((d, t))
        ).run(new_passphrase=None, new_api_key=None)
        after = _decrypted(relay, report.new_vault_id, _keys(session, report.new_vault_id))
    assert len(threads) == 3  # three worker threads pushed at once
    assert after == before
    assert (report.held, report.pushed, report.batches) == (15, 15, 8)
    assert [d for d, _ in seen] == [0, 2, 4, 6, 8, 10, 12, 14, 15]
    assert {t for _, t in seen} == {15}


def test_a_push_failing_inside_the_pipeline_stops_the_copy_and_a_rerun_finishes(
    tmp_path: Path, relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "laptop"
    _vault_of(path, relay, "team-pipeline-fail", extra=10)
    real_push = RelayClient.push
    calls: list[int] = []

    def failing_push(self: RelayClient, vault_id: str, blobs: list[SyncBlob]) -> PushResponse:
        if vault_id != "team-pipeline-fail":
            calls.append(len(blobs))
            if len(calls) == 3:
                raise SyncError("the third push of the copy failed")
        return real_push(self, vault_id, blobs)

    with VaultSession.open(path, PASSPHRASE) as session:
        before = _decrypted(relay, "team-pipeline-fail", _keys(session, "team-pipeline-fail"))
        monkeypatch.setattr(RelayClient, "push", failing_push)
        with pytest.raises(SyncError, match="third push"):
            Rekey(session, push_batch=2, push_concurrency=3).run(
                new_passphrase=None, new_api_key=None
            )
        assert session.config.vault_id == "team-pipeline-fail"  # nothing retired or switched
        monkeypatch.setattr(RelayClient, "push", real_push)
        report = Rekey(session, push_batch=2, push_concurrency=3).run(
            new_passphrase=None, new_api_key=None
        )
        after = _decrypted(relay, report.new_vault_id, _keys(session, report.new_vault_id))
    assert report.resumed is True
    assert report.already_there > 0  # the batches answered before the failure stayed
    assert report.already_there + report.pushed == 15
    assert after == before
