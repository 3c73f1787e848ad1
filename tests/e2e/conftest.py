"""End-to-end fixtures: a real relay (uvicorn + PostgreSQL) and devices with real SQLCipher
vaults in separate directories, driven through the client library."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engram_sync.client._http.relay_client import RelayClient
from engram_sync.client._session import VaultSession
from engram_sync.client._sync.reports import SyncReport
from engram_sync.relay.services.config import RelayConfig
from tests.relay.conftest import ADMIN_KEY, Relay, RelayThread, base_config

PASSPHRASE = "e2e correct horse battery staple"
VAULT_ID = "team-e2e"


@pytest.fixture
def relay(fresh_database_url: str) -> Iterator[Relay]:
    config: RelayConfig = base_config(fresh_database_url)
    server = RelayThread(config).start()
    try:
        yield Relay(server.url, fresh_database_url, config)
    finally:
        server.stop()


class _Borrowed:
    """A context manager handing out the device's long-lived session without closing it."""

    def __init__(self, session: VaultSession) -> None:
        self.session = session

    def __enter__(self) -> VaultSession:
        return self.session

    def __exit__(self, *exc: object) -> None:
        return None


@dataclass
class DeviceHandle:
    """One device: a vault directory kept open like a running daemon; `restart()` reopens it
    from disk (device.json, sync_state.json and the database), as after a process restart."""

    name: str
    path: Path
    relay: Relay
    passphrase: str = PASSPHRASE
    session: VaultSession | None = None

    def open(self) -> _Borrowed:
        if self.session is None:
            self.session = VaultSession.open(self.path, self.passphrase, create=False)
        return _Borrowed(self.session)

    def restart(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    def sync(self, **options: Any) -> SyncReport:
        with self.open() as session, session.relay(max_retries=1, backoff_base=0) as client:
            return session.syncer(client, **options).sync()

    def relay_client(self) -> RelayClient:
        return RelayClient(self.relay.url, ADMIN_KEY)


def make_device(
    tmp_path: Path, relay: Relay, name: str, key: str | Callable[[str], str] = ADMIN_KEY
) -> DeviceHandle:
    """Create a vault and link it; `key` may be a function of the new device's id."""
    path = tmp_path / name
    with VaultSession.open(path, PASSPHRASE, create=True) as session:
        api_key = key(session.device.device_id) if callable(key) else key
        session.link(relay.url, api_key, VAULT_ID, name)
    return DeviceHandle(name, path, relay)


@pytest.fixture
def devices(tmp_path: Path, relay: Relay) -> Iterator[list[DeviceHandle]]:
    handles = [make_device(tmp_path, relay, name) for name in ("alpha", "bravo", "charlie")]
    yield handles
    for handle in handles:
        handle.restart()
