"""Helpers shared by the relay's integration tests (real HTTP, real PostgreSQL, real crypto).

`module_relay` serves one relay on its own freshly migrated database for a whole
test module: tests in such a module isolate themselves by using their own vault
ids (`new_vault_id`), which keeps the suite fast. Tests that need an exact view
of the whole database (health counters, dumps, restarts) use the per-test
`relay` fixture of conftest.py instead.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

import asyncpg
import httpx
import msgspec
import pytest

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.services.config import RelayConfig
from engram_sync.shared_format import BlobCipher, SyncBlob, SyncKeys
from tests.conftest import (
    migrated_backend_database,
    migrated_database,
    takes_backend,
)
from tests.relay.conftest import ADMIN_KEY, Relay, RelayThread, base_config

T = TypeVar("T")

BlobLike = SyncBlob | Mapping[str, Any]


# Loading the CA bundle costs ~60 ms per httpx.Client; the relay is plain HTTP anyway.
SSL = ssl.create_default_context()


def client(relay: Relay, key: str | None = ADMIN_KEY, **kwargs: Any) -> httpx.Client:
    """`relay.client(key)` without the per-client TLS setup cost."""
    return relay.client(key, verify=SSL, **kwargs)


def new_vault_id(prefix: str = "vault") -> str:
    """A vault id no other test uses."""
    return f"{prefix}-{secrets.token_hex(6)}"


WAIT_S = 60  # the bound on waiting for a state; never reached when things work


def wait_for(condition: Callable[[], bool], what: str, *, every: float = 0.05) -> None:
    """Poll `condition` until it holds; AssertionError naming `what` after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(every)


def new_device_id() -> str:
    """A device id as devices make them (UUIDv4 text)."""
    return str(uuid.uuid4())


def run_db(database_url: str, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    """Run `work` on a fresh asyncpg connection to `database_url` (from sync test code)."""

    async def go() -> T:
        conn = await asyncpg.connect(to_libpq_url(database_url))
        try:
            return await work(conn)
        finally:
            await conn.close()

    return asyncio.run(go())


async def _admin_execute(server_url: str, sql: str) -> None:
    conn = await asyncpg.connect(to_libpq_url(server_url))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextmanager
def serve(config: RelayConfig) -> Iterator[Relay]:
    """A relay serving `config` over real HTTP until the block ends."""
    server = RelayThread(config).start()
    try:
        yield Relay(server.url, config.database_url, config)
    finally:
        server.stop()


@contextmanager
def module_relay(postgres_url: str, **changes: Any) -> Iterator[Relay]:
    """A relay on its own new database (base config plus `changes`), for a whole module."""
    with migrated_database(postgres_url) as url, serve(replace(base_config(url), **changes)) as r:
        yield r


def module_relay_fixture(**changes: Any) -> Callable[[str], Iterator[Relay]]:
    """A module-scoped `relay` fixture serving `module_relay(postgres_url, **changes)`:
    `relay = module_relay_fixture()` at the top of a test module."""

    @pytest.fixture(scope="module", name="relay")
    @takes_backend
    def relay(request: pytest.FixtureRequest, postgres_url: str) -> Iterator[Relay]:
        # also on the Citus cluster in modules marked both_databases (tests/conftest.py)
        with (
            migrated_backend_database(request, postgres_url) as url,
            serve(replace(base_config(url), **changes)) as served,
        ):
            yield served

    return relay


class Sealer:
    """Seals real blobs (AES-256-GCM + HMAC-SHA256) for one vault under random keys."""

    def __init__(self, vault_id: str, keys: SyncKeys | None = None) -> None:
        self.vault_id = vault_id
        self.keys = keys or SyncKeys(os.urandom(32), os.urandom(32))
        self.cipher = BlobCipher(self.keys)
        self.device_id = new_device_id()

    def blob(
        self,
        memory_id: str,
        clock: int,
        *,
        device_id: str | None = None,
        deleted: bool = False,
        text: str | None = None,
        created_at: str | None = None,
        vault_id: str | None = None,
    ) -> SyncBlob:
        """One sealed blob; the plaintext defaults to a small JSON object naming the memory."""
        if text is None:
            text = (
                f'{{"deleted":true,"id":"{memory_id}"}}'
                if deleted
                else f'{{"content":"memory {memory_id} v{clock}","id":"{memory_id}"}}'
            )
        return self.cipher.seal(
            text,
            vault_id=vault_id if vault_id is not None else self.vault_id,
            memory_id=memory_id,
            device_id=device_id if device_id is not None else self.device_id,
            vector_clock=clock,
            deleted=deleted,
            created_at=created_at,
        )

    def sized(
        self, memory_id: str, clock: int, chars: int, *, device_id: str | None = None
    ) -> SyncBlob:
        """A live blob whose ciphertext text is exactly `chars` characters (a multiple of 4)."""
        assert chars % 4 == 0
        assert chars >= 40
        blob = self.blob(memory_id, clock, device_id=device_id, text="x" * (chars // 4 * 3 - 28))
        assert len(blob.ciphertext) == chars
        return blob

    def blobs(self, count: int, *, prefix: str = "mem", clock: int = 1) -> list[SyncBlob]:
        """`count` blobs for distinct memories `prefix-0000` …"""
        return [self.blob(f"{prefix}-{i:04d}", clock) for i in range(count)]


def wire(blob: BlobLike) -> dict[str, Any]:
    """A blob as the JSON object that goes over the wire."""
    if isinstance(blob, SyncBlob):
        built: dict[str, Any] = msgspec.to_builtins(blob)
        return built
    return dict(blob)


def push(
    client: httpx.Client, vault_id: str, blobs: Sequence[BlobLike], **kwargs: Any
) -> httpx.Response:
    """POST a batch to the vault's push route."""
    return client.post(
        f"/v1/vaults/{vault_id}/push", json={"blobs": [wire(b) for b in blobs]}, **kwargs
    )


def push_ok(client: httpx.Client, vault_id: str, blobs: Sequence[BlobLike]) -> dict[str, Any]:
    """Push and require a 200; returns the parsed answer."""
    response = push(client, vault_id, blobs)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def push_in_batches(
    client: httpx.Client, vault_id: str, blobs: Sequence[BlobLike], batch: int = 1000
) -> int:
    """Push in batches of at most `batch`; returns the number accepted."""
    accepted = 0
    for start in range(0, len(blobs), batch):
        answer = push_ok(client, vault_id, blobs[start : start + batch])
        assert answer["rejected"] == []
        accepted += answer["accepted"]
    return accepted


def generation(client: httpx.Client) -> str:
    """The relay generation /v1/info advertises (PROTOCOL §17)."""
    info: str = client.get("/v1/info").json()["generation"]
    return info


def pull(client: httpx.Client, vault_id: str, **params: Any) -> httpx.Response:
    """GET the vault's pull route with query parameters (None values left out)."""
    query = {k: v for k, v in params.items() if v is not None}
    return client.get(f"/v1/vaults/{vault_id}/pull", params=query)


def pull_ok(client: httpx.Client, vault_id: str, **params: Any) -> dict[str, Any]:
    """Pull and require a 200; returns the parsed page."""
    response = pull(client, vault_id, **params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def pull_all(
    client: httpx.Client, vault_id: str, *, cursor: int = 0, limit: int | None = None
) -> tuple[list[dict[str, Any]], int]:
    """Page with `cursor` until `has_more` is false; returns (blobs, last cursor)."""
    seen: list[dict[str, Any]] = []
    for _ in range(10_000):
        page = pull_ok(client, vault_id, cursor=cursor, limit=limit)
        seen.extend(page["blobs"])
        assert page["cursor"] >= cursor
        cursor = page["cursor"]
        if not page["has_more"]:
            return seen, cursor
        assert page["blobs"], "a page that claims has_more must carry blobs"
    raise AssertionError("pull never finished")


def versions(blobs: Sequence[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """(memory_id, vector_clock) of each blob, in order."""
    return [(b["memory_id"], b["vector_clock"]) for b in blobs]


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The response is a JSON error `{"error": str, "code": str}` with this status (and code)."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body: dict[str, Any] = response.json()
    assert isinstance(body.get("error"), str), body
    assert body["error"], body
    assert isinstance(body.get("code"), str), body
    if code is not None:
        assert body["code"] == code, body
    return body


async def wait_for_lock_waiters(
    conn: asyncpg.Connection, application_name: str, count: int
) -> None:
    """Until `count` backends named `application_name` wait on a lock (a test's gate): the
    deterministic interleaving of the race tests (bounded poll, WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    # On Citus a router statement waits on its shard's worker, not on the coordinator
    # backend the test named: count the cluster's lock waits there instead.
    citus = await conn.fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'citus'")
    while True:
        if citus:
            waiting = await conn.fetchval(
                "SELECT count(DISTINCT waiting_gpid) FROM citus_lock_waits"
            )
        else:
            waiting = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = $1 AND wait_event_type = 'Lock'",
                application_name,
            )
        if waiting >= count:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{waiting} of {count} {application_name} backends wait on a lock")
        await asyncio.sleep(0.02)
