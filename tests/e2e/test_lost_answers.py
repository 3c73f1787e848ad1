"""A push whose answer is lost (the relay committed it) is retried safely (PROTOCOL §6, §8)."""

from __future__ import annotations

from engram_sync.client._errors import RelayUnavailableError
from engram_sync.client._http.relay_client import RelayClient
from engram_sync.shared_format.wire import PushResponse, SyncBlob
from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add, conflicts, contents, edit, sync_all


class LosesPushAnswers(RelayClient):
    """Delivers the push, then behaves as if the connection dropped before the answer."""

    def push(self, vault_id: str, blobs: list[SyncBlob]) -> PushResponse:
        super().push(vault_id, blobs)
        raise RelayUnavailableError("connection dropped (simulated)", url=self.base_url)


def _sync_losing_answer(device: DeviceHandle) -> None:
    with device.open() as session:
        client = LosesPushAnswers(device.relay.url, session.config.api_key, max_retries=0)
        with client:
            try:
                session.syncer(client).sync()
            except RelayUnavailableError:
                pass
            else:
                raise AssertionError("the simulated drop did not happen")


def test_lost_answer_then_new_edit_keeps_the_new_edit(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    memory_id = add(alpha, "v1")
    _sync_losing_answer(alpha)  # v1 is on the relay, alpha does not know it
    edit(alpha, memory_id, "v2")  # a newer local edit
    report = alpha.sync()
    assert report.conflicts == 0
    assert contents(alpha)[memory_id] == "v2"
    bravo.sync()
    assert contents(bravo)[memory_id] == "v2"
    assert conflicts(alpha) == []


def test_lost_answer_is_recognised_without_pushing_twice(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    memory_id = add(alpha, "only once")
    _sync_losing_answer(alpha)
    report = alpha.sync()
    assert (report.pushed, report.conflicts) == (0, 0)  # recognised as already on the relay
    sync_all(alpha, bravo)
    assert contents(bravo) == {memory_id: "only once"}
    (row,) = alpha.relay.sql("SELECT count(*) AS n FROM blobs")
    assert row["n"] == 1
