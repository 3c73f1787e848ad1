"""A real relay over real HTTP: uvicorn serving the app on a free loopback port."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import asyncpg
import httpx
import pytest
import uvicorn

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.domain.api_keys import parse_static_keys
from engram_sync.relay.services.config import RelayConfig
from engram_sync.relay.serving.app import create_app
from engram_sync.relay.store.minted_keys import create_key

ADMIN_KEY = "test-operator-key-0123456789abcdef"
METRICS_TOKEN = "test-metrics-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RelayThread:
    """uvicorn in a background thread; `stop()` shuts it down like SIGTERM would."""

    def __init__(self, config: RelayConfig) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(
                create_app(config),
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                # as relay.serving.server serves it (relay.domain.client_address)
                proxy_headers=False,
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> RelayThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("relay did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@dataclass
class Relay:
    """A running relay plus helpers to mint keys in its database."""

    url: str
    database_url: str
    config: RelayConfig

    def client(self, key: str | None = ADMIN_KEY, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kwargs)

    def scrape(self) -> str:
        """GET /metrics with the metrics token (relay.http.routes.system)."""
        response = httpx.get(
            f"{self.url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=30
        )
        response.raise_for_status()
        return response.text

    def mint(
        self,
        vault_id: str | None,
        *,
        admin: bool = False,
        device_id: str | None = None,
        rate: int = 1000,
    ) -> str:
        async def go() -> str:
            conn = await asyncpg.connect(to_libpq_url(self.database_url))
            try:
                _, key = await create_key(
                    conn, vault_id=vault_id, is_admin=admin, device_id=device_id, rate=rate
                )
                return key
            finally:
                await conn.close()

        return asyncio.run(go())

    def sql(self, query: str, *args: Any) -> list[asyncpg.Record]:
        async def go() -> list[asyncpg.Record]:
            conn = await asyncpg.connect(to_libpq_url(self.database_url))
            try:
                rows: list[asyncpg.Record] = await conn.fetch(query, *args)
                return rows
            finally:
                await conn.close()

        return asyncio.run(go())


def base_config(database_url: str) -> RelayConfig:
    return RelayConfig(
        database_url=database_url,
        static_keys=tuple(parse_static_keys(f"{ADMIN_KEY}:100000")),
        pool_min_size=1,
        pool_max_size=8,
        health_refresh_secs=0.2,
        metrics_token=METRICS_TOKEN,
    )


@pytest.fixture
def relay_config(fresh_database_url: str) -> RelayConfig:
    """Override in a test module to change limits; the database is fresh per test."""
    return base_config(fresh_database_url)


@pytest.fixture
def relay(relay_config: RelayConfig) -> Iterator[Relay]:
    server = RelayThread(relay_config).start()
    try:
        yield Relay(server.url, relay_config.database_url, relay_config)
    finally:
        server.stop()


def with_limits(config: RelayConfig, **changes: Any) -> RelayConfig:
    return replace(config, **changes)


@pytest.fixture
def http(relay: Relay) -> Iterator[httpx.Client]:
    """An HTTP client on the `relay` in scope (modules may override `relay`) with the
    operator key."""
    from tests.relay.support import client

    with client(relay) as c:
        yield c


@pytest.fixture
def vault() -> str:
    """A vault id no other test uses."""
    from tests.relay.support import new_vault_id

    return new_vault_id()
