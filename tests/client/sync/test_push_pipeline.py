"""A sync's push seals the next batch while the relay answers the one sent
(client._sync.push_pipeline, issue 36), on a real SQLCipher vault and a real relay: the
batches still reach the relay one at a time, in edit order, each memory once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import msgspec
import pytest

from engram_sync.client._errors import (
    DeviceRevokedError,
    InvalidBlobError,
    RelayUnavailableError,
)
from engram_sync.client._http.relay_client import RelayClient
from engram_sync.client._session import VaultSession
from engram_sync.client._sync.push_pipeline import GROUP_BYTES, PushPipeline, Sent
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


class FailingRelayClient(RelayClient):
    """A real relay client whose push number `fails` (0: none) raises as an unreachable
    relay does, without asking the relay (nothing of that batch is written), or, with
    `lie`, is pushed and answered with this device named revoked, or, with `refuse`, is
    refused for its first blob (a 400 naming it)."""

    def __init__(
        self, session: VaultSession, fails: int, *, lie: bool = False, refuse: bool = False
    ) -> None:
        assert session.config.server_url is not None
        super().__init__(
            session.config.server_url, session.config.api_key, device_id=session.device.device_id
        )
        self.device_id = session.device.device_id
        self.fails = fails
        self.lie = lie
        self.refuse = refuse
        self.pushes = 0

    def push(self, vault_id: str, blobs: list[SyncBlob]) -> PushResponse:
        self.pushes += 1
        if self.pushes == self.fails and self.refuse:  # PROTOCOL §6 step 1: nothing written
            raise InvalidBlobError("invalid blob", index=0, reason="a made-up refusal")
        if self.pushes == self.fails and not self.lie:
            raise RelayUnavailableError("the relay went away", url=self.base_url)
        answer = super().push(vault_id, blobs)
        if self.pushes == self.fails:
            return msgspec.structs.replace(answer, revoked_devices=[self.device_id])
        return answer


def marking_transactions(statements: list[str]) -> int:
    """How many of the traced transactions marked rows pushed."""
    count, marks = 0, False
    for statement in statements:
        if statement.startswith("BEGIN"):
            marks = False
        elif statement.startswith("UPDATE engrams SET synced_at"):
            marks = True
        elif statement.startswith("COMMIT") and marks:
            count += 1
    return count


@pytest.mark.parametrize(("group", "transactions"), [(4, 2), (1, 8)])
def test_answered_batches_are_marked_pushed_a_group_at_a_time(
    alpha: VaultSession, group: int, transactions: int
) -> None:
    """One SQLite transaction marks `group` answered batches (one commit, one fold of
    the kept digest), not one each: 8 batches in 2 transactions with a group of 4."""
    with alpha.vault.transaction() as conn:
        for i in range(8 * BATCH):
            local_store.add_memory(conn, f"grouped {i}")
    statements: list[str] = []
    alpha.vault.conn.set_trace_callback(statements.append)
    try:
        with FailingRelayClient(alpha, fails=0) as client:
            report = alpha.syncer(client, push_batch=BATCH, settle_group=group).sync()
    finally:
        alpha.vault.conn.set_trace_callback(None)
    assert report.pushed == 8 * BATCH
    assert local_store.count_to_push(alpha.vault.conn) == (0, 0)
    assert marking_transactions(statements) == transactions


def test_a_failed_batch_leaves_the_batches_answered_before_it_marked(
    alpha: VaultSession,
) -> None:
    """The third push fails while the first two are answered and wait to be settled in
    the same group: they are marked pushed all the same. The sender sends nothing after
    the failure, and the rest stays pending until the next sync, which pushes it."""
    with alpha.vault.transaction() as conn:
        for i in range(8 * BATCH):
            local_store.add_memory(conn, f"failing {i}")
    client = FailingRelayClient(alpha, fails=3)
    with client, pytest.raises(RelayUnavailableError):
        alpha.syncer(client, push_batch=BATCH, settle_group=4).sync()
    assert client.pushes == 3  # none after the failure, though three more were sealed
    assert local_store.count_to_push(alpha.vault.conn) == (6 * BATCH, 0)
    with FailingRelayClient(alpha, fails=0) as again:
        assert alpha.syncer(again, push_batch=BATCH).sync().pushed == 6 * BATCH
    assert local_store.count_to_push(alpha.vault.conn) == (0, 0)


def test_a_400_naming_a_blob_stops_nothing_behind_it(alpha: VaultSession) -> None:
    """The relay refuses the second batch for its first blob: that memory is kept local and
    reported, the rest of the batch goes again, and every batch sealed behind it is sent
    (a 400 naming a blob is handled and the push goes on: the sender does not stop)."""
    with alpha.vault.transaction() as conn:
        for i in range(8 * BATCH):
            local_store.add_memory(conn, f"refused {i}")
    client = FailingRelayClient(alpha, fails=2, refuse=True)
    with client:
        report = alpha.syncer(client, push_batch=BATCH, settle_group=4).sync()
    assert client.pushes == 8 + 1  # the refused batch once more, without its first blob
    assert report.pushed == 8 * BATCH - 1
    assert len(report.unpushable) == 1
    assert local_store.count_to_push(alpha.vault.conn) == (1, 0)


def test_no_batch_leaves_after_an_answer_that_names_this_device_revoked(
    alpha: VaultSession,
) -> None:
    """A lying relay answers the second batch with this device revoked: the sync stops
    with the revocation, the first batch is marked pushed, and the sender sends none of
    the batches sealed behind the second (threat model, "lying relay")."""
    with alpha.vault.transaction() as conn:
        for i in range(8 * BATCH):
            local_store.add_memory(conn, f"revoked {i}")
    client = FailingRelayClient(alpha, fails=2, lie=True)
    with client, pytest.raises(DeviceRevokedError):
        alpha.syncer(client, push_batch=BATCH, settle_group=4).sync()
    assert client.pushes == 2
    assert local_store.count_to_push(alpha.vault.conn) == (7 * BATCH, 0)


def batch_of(chars: int) -> list[SyncBlob]:
    return [SyncBlob("vault", "mem", "device", 1, "A" * chars, "h", "2026-01-01", False)]


@pytest.mark.parametrize(
    ("chars", "groups"),
    [
        (10, [(4, 6), (4, 9), (1, 9)]),
        (GROUP_BYTES // 2 + 1, [(2, 4), (2, 6), (2, 8), (2, 9), (1, 9)]),
    ],
)
def test_answers_are_settled_a_group_at_a_time_or_fewer_past_the_bytes(
    chars: int, groups: list[tuple[int, int]]
) -> None:
    """Two batches in flight stay unsettled (depth 3); behind them, answered batches are
    settled `group` at a time, or as soon as they hold GROUP_BYTES of ciphertext (what
    waits unsettled stays bounded); `drain` settles the rest, in order. `groups`: each
    settled group's size and how many batches had been sent then."""
    sent = 0
    settled: list[list[Sent]] = []
    when: list[tuple[int, int]] = []

    def settle(group: list[Sent]) -> None:
        assert all(s.answer.result() is answer for s in group)  # each one sent and answered
        settled.append(group)
        when.append((len(group), sent))

    answer = cast(PushResponse, None)  # only passed through to `settle`
    with PushPipeline(lambda blobs: answer, settle, depth=3, group=4) as pipeline:
        for clock in range(9):
            sent += 1
            pipeline.send([("mem", "text", None)], batch_of(chars), [clock], deleted=False)
        pipeline.drain()
    assert when == groups
    assert [s.clocks[0] for group in settled for s in group] == list(range(9))
