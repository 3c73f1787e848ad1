"""The exact answers of the push and pull refusals over real HTTP (PROTOCOL §5, §6, §9).

Golden values, written down once from the relay's answers before issue 19 ("Errors")
moved these refusals out of the HTTP layer: the store and rules layers now raise domain
exceptions (`relay.domain.domain_errors`) and `relay.http.errors` alone turns each into its status,
headers and body. Never recompute them from the code under test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import httpx
import msgspec
import pytest

from engram_sync.relay.services.push_groups import PushGroups
from engram_sync.relay.services.state import RelayState
from engram_sync.relay.store.push import PushJob, PushResult
from engram_sync.shared_format.b64 import b64encode_std
from tests.relay.conftest import Relay, RelayThread, base_config
from tests.relay.support import (
    Sealer,
    client,
    migrated_database,
    module_relay,
    new_vault_id,
    pull,
    push,
    push_ok,
)

QUOTA_BYTES = 2000
QUOTA_DEVICES = 2
# Headers an error answer may carry only when its refusal calls for them.
SITUATIONAL = ("retry-after", "www-authenticate")


@pytest.fixture(scope="module")
def relay(postgres_url: str) -> Iterator[Relay]:
    with module_relay(postgres_url, quota_bytes=QUOTA_BYTES, quota_devices=QUOTA_DEVICES) as r:
        yield r


@pytest.fixture
def http(relay: Relay) -> Iterator[httpx.Client]:
    with client(relay) as c:
        yield c


def assert_answer(
    response: httpx.Response,
    status: int,
    body: dict[str, object],
    headers: dict[str, str] | None = None,
) -> None:
    """Exactly this status, JSON body and situational headers (and no other of those)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json() == body
    expected = headers or {}
    assert {h: response.headers[h] for h in SITUATIONAL if h in response.headers} == expected


def test_empty_batch(http: httpx.Client) -> None:
    assert_answer(
        push(http, new_vault_id("empty"), []),
        400,
        {"error": "empty batch: send 1 to 1000 blobs", "code": "empty_batch"},
    )


def test_batch_too_large(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id("large")
    relay.sql("INSERT INTO quotas (vault_id, max_bytes) VALUES ($1, 0)", vault)  # unlimited
    blobs = Sealer(vault).blobs(1001)
    assert_answer(
        push(http, vault, blobs),
        400,
        {"error": "1001 blobs in one push; at most 1000", "code": "batch_too_large"},
    )
    assert push_ok(http, vault, blobs[:1000])["accepted"] == 1000  # the limit itself is fine


def test_invalid_blob_names_index_reason_and_field(http: httpx.Client) -> None:
    vault = new_vault_id("invalid")
    sealer = Sealer(vault)
    bad = msgspec.structs.replace(sealer.blob("bad", 1), hmac=b64encode_std(b"\x00" * 31))
    assert_answer(
        push(http, vault, [sealer.blob("good", 1), bad]),
        400,
        {
            "error": "blob 1: hmac decodes to 31 bytes, not 32; nothing was written",
            "code": "invalid_blob",
            "index": 1,
            "reason": "hmac decodes to 31 bytes, not 32",
            "field": "blobs[1].hmac",
        },
    )
    assert_answer(
        push(http, vault, [msgspec.structs.replace(sealer.blob("m", 1), memory_id="")]),
        400,
        {
            "error": "blob 0: memory_id is empty; nothing was written",
            "code": "invalid_blob",
            "index": 0,
            "reason": "memory_id is empty",
            "field": "blobs[0].memory_id",
        },
    )
    assert push_ok(http, vault, [sealer.blob("good", 1)])["accepted"] == 1


def test_bytes_quota(http: httpx.Client) -> None:
    vault = new_vault_id("bytes")
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.sized("a", 1, 1200)])
    assert_answer(
        push(http, vault, [sealer.sized("b", 1, 1200)]),
        402,
        {"error": {"code": "quota_exceeded", "detail": "bytes", "limit": 2000, "used": 2400}},
    )
    assert push_ok(http, vault, [sealer.sized("b", 1, 800)])["accepted"] == 1  # 2000 fits


def test_devices_quota(http: httpx.Client) -> None:
    vault = new_vault_id("devices")
    for i in range(QUOTA_DEVICES):
        push_ok(http, vault, [Sealer(vault).blob(f"m{i}", 1)])
    assert_answer(
        push(http, vault, [Sealer(vault).blob("m-third", 1)]),
        402,
        {"error": {"code": "quota_exceeded", "detail": "devices", "limit": 2, "used": 3}},
    )


def test_resync_required(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id("resync")
    push_ok(http, vault, Sealer(vault).blobs(6))
    relay.sql("UPDATE vaults SET compacted_through = 5 WHERE vault_id = $1", vault)
    assert_answer(
        pull(http, vault, cursor=2),
        409,
        {
            "error": "cursor 2 is behind the compaction horizon 5: "
            "pull again from cursor 0 and reconcile",
            "code": "resync_required",
            "horizon": 5,
        },
    )
    assert_answer(
        pull(http, vault, cursor=6, origin=3),
        409,
        {
            "error": "cursor 6 is behind the compaction horizon 5: "
            "pull again from cursor 0 and reconcile",
            "code": "resync_required",
            "horizon": 5,
        },
    )
    assert pull(http, vault, cursor=5).status_code == 200  # at the horizon is fine


def test_vault_retired_and_already_retired(http: httpx.Client) -> None:
    """PROTOCOL §19: the 410 of a push to a retired vault and the 409 of a second retire
    naming another successor (golden: written down from the relay's first answers)."""
    old, new = new_vault_id("retired"), new_vault_id("successor")
    sealer = Sealer(old)
    assert push_ok(http, old, [sealer.blob("before", 1)])["accepted"] == 1
    assert http.post(f"/v1/vaults/{old}/retire", json={"successor": new}).status_code == 200
    assert_answer(
        push(http, old, [sealer.blob("after", 1)]),
        410,
        {
            "error": f"vault {old} was retired (its successor is {new}); it takes no more "
            "writes: re-key or link this device to the successor",
            "code": "vault_retired",
            "successor": new,
        },
    )
    assert_answer(
        http.post(f"/v1/vaults/{old}/retire", json={"successor": None}),
        409,
        {
            "error": f"vault {old} was already retired with another successor; "
            "the stored one is in `successor`",
            "code": "already_retired",
            "successor": new,
        },
    )
    alone = new_vault_id("alone")
    assert http.post(f"/v1/vaults/{alone}/retire", json={"successor": None}).status_code == 200
    assert_answer(
        push(http, alone, [Sealer(alone).blob("m", 1)]),
        410,
        {
            "error": f"vault {alone} was retired (it named no successor); it takes no more "
            "writes: re-key or link this device to the successor",
            "code": "vault_retired",
            "successor": None,
        },
    )


async def _cancelled(
    jobs: list[PushJob], committed: Callable[[list[PushResult]], None]
) -> list[PushResult]:
    """A group transaction cut short as at shutdown: its lane task is cancelled."""
    raise asyncio.CancelledError


def test_push_cut_short_by_shutdown(postgres_url: str) -> None:
    """The 503 a waiting push gets when its lane stops (relay.services.push_groups), over real HTTP:
    the relay's own app with a group runner that is cancelled as at shutdown."""
    with migrated_database(postgres_url) as url:
        config = base_config(url)
        server = RelayThread(config).start()
        try:
            state: RelayState = server.server.config.app.state.relay
            vault = new_vault_id("shutdown")
            sealer = Sealer(vault)
            relay = Relay(server.url, url, config)
            with client(relay) as http:
                assert push_ok(http, vault, [sealer.blob("before", 1)])["accepted"] == 1
                state.push_groups = PushGroups(_cancelled, lanes=1, max_group_blobs=1000)
                assert_answer(
                    push(http, vault, [sealer.blob("during", 1)]),
                    503,
                    {"error": "the relay is shutting down; retry", "code": "unavailable"},
                    {"retry-after": "1"},
                )
        finally:
            server.stop()
