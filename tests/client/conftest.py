"""A real relay (uvicorn on loopback over a fresh migrated PostgreSQL database)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from engram_sync.relay.services.config import RelayConfig
from tests.relay.conftest import Relay, RelayThread, base_config

StartRelay = Callable[[RelayConfig], Relay]


@pytest.fixture
def start_relay() -> Iterator[StartRelay]:
    """Start relays with any config; all are stopped after the test."""
    servers: list[RelayThread] = []

    def start(config: RelayConfig) -> Relay:
        server = RelayThread(config).start()
        servers.append(server)
        return Relay(server.url, config.database_url, config)

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def relay(fresh_database_url: str, start_relay: StartRelay) -> Relay:
    """A relay with the default test config (operator key ADMIN_KEY, no quotas)."""
    return start_relay(base_config(fresh_database_url))
