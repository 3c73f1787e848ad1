"""The hostile-relay harness: one real `engram-relay serve` process per module, a fresh
lying proxy per test in front of it, and devices with real SQLCipher vaults linked
through the proxy, each test on a vault id of its own."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engram_sync.client._session import VaultSession
from tests.conftest import migrated_database
from tests.e2e.conftest import PASSPHRASE, DeviceHandle
from tests.e2e.hostile.proxy import HostileProxy
from tests.relay.conftest import ADMIN_KEY, Relay, base_config
from tests.reliability.support import RelayProcess


@pytest.fixture(scope="module")
def relay_process(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    """The real relay as a process, on a database of this module's own."""
    with migrated_database(postgres_url) as url:
        process = RelayProcess(url, log_path=tmp_path_factory.mktemp("relay") / "relay.log")
        process.start()
        try:
            yield Relay(process.url, url, base_config(url))
        finally:
            process.stop()


@pytest.fixture
def proxy(relay_process: Relay) -> Iterator[HostileProxy]:
    server = HostileProxy(relay_process.url).start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Scene:
    """Devices of one vault linked through the proxy; `relay` is the real relay behind it."""

    proxy: HostileProxy
    relay: Relay
    vault_id: str
    tmp_path: Path
    handles: list[DeviceHandle] = field(default_factory=list)

    def device(self, name: str, *, through_proxy: bool = True) -> DeviceHandle:
        url = self.proxy.url if through_proxy else self.relay.url
        path = self.tmp_path / name
        with VaultSession.open(path, PASSPHRASE, create=True) as session:
            session.link(url, ADMIN_KEY, self.vault_id, name)
        return self._handle(name, path, url, PASSPHRASE)

    def blank_device(
        self, name: str, passphrase: str, *, through_proxy: bool = True
    ) -> DeviceHandle:
        """A new vault, not linked: it links itself (e.g. with a pairing code) to
        `handle.relay.url`."""
        url = self.proxy.url if through_proxy else self.relay.url
        path = self.tmp_path / name
        VaultSession.open(path, passphrase, create=True).close()
        return self._handle(name, path, url, passphrase)

    def _handle(self, name: str, path: Path, url: str, passphrase: str) -> DeviceHandle:
        relay = Relay(url, self.relay.database_url, self.relay.config)
        handle = DeviceHandle(name, path, relay, passphrase=passphrase)
        self.handles.append(handle)
        return handle


@pytest.fixture
def scene(proxy: HostileProxy, relay_process: Relay, tmp_path: Path) -> Iterator[Scene]:
    made = Scene(proxy, relay_process, f"hostile-{secrets.token_hex(6)}", tmp_path)
    yield made
    for handle in made.handles:
        handle.restart()
