"""One relay client per vault session (issue 36, client._session.VaultSession.shared_relay):
every `Vault.sync` of a session uses one connection pool and asks the relay's /v1/info once;
a new relay or device id gets a new client. A real relay and real vaults."""

from __future__ import annotations

import pytest

from engram_sync.client import Vault
from engram_sync.client._http.relay_client import RelayClient
from engram_sync.shared_format.wire import RelayInfo
from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add


def test_the_syncs_of_a_session_share_one_client_and_one_info(
    devices: list[DeviceHandle], monkeypatch: pytest.MonkeyPatch
) -> None:
    alpha, bravo, _ = devices
    asked: list[str] = []
    info = RelayClient.info

    def counted(self: RelayClient) -> RelayInfo:
        asked.append(self.base_url)
        return info(self)

    monkeypatch.setattr(RelayClient, "info", counted)
    with alpha.open() as session:
        vault = Vault(session)
        add(alpha, "one")
        assert vault.sync().pushed == 1
        first = session.shared_relay()
        add(alpha, "two")
        assert vault.sync().pushed == 1
        assert vault.sync().pushed == 0
        assert session.shared_relay() is first
        assert len(asked) == 1  # features and limits from one answer, for the session
        session.renew_device_id()  # the client's header names the device: a new client
        assert session.shared_relay() is not first
        assert first._http.is_closed
    with bravo.open() as session:
        assert Vault(session).sync().applied == 2
    assert len(asked) == 2  # bravo's session asked once
