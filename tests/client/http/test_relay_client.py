"""RelayClient against a real relay over real HTTP (real PostgreSQL).

Only the retry/backoff unit tests use an httpx.MockTransport, to script
sequences of 503/429/connection errors; nothing ever really sleeps.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import msgspec
import pytest

from engram_sync.client import __version__
from engram_sync.client._errors import (
    AuthError,
    DeviceRevokedError,
    ForbiddenError,
    ProtocolError,
    QuotaExceededError,
    RateLimitedError,
    RelayError,
    RelayUnavailableError,
    ResyncRequiredError,
    SyncError,
)
from engram_sync.client._http.relay_client import RelayClient, path_segment
from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.store.compaction import compact_vault
from engram_sync.shared_format.wire import SyncBlob
from tests.client.conftest import StartRelay
from tests.relay.conftest import ADMIN_KEY, Relay, base_config, free_port, with_limits

VAULT = "vault-client-tests"


def b64(n: int) -> str:
    return base64.b64encode(os.urandom(n)).decode()


def blob(
    memory_id: str,
    clock: int = 1,
    *,
    vault_id: str = VAULT,
    device_id: str = "device-a",
    deleted: bool = False,
    size: int = 64,
) -> SyncBlob:
    """A structurally valid blob (the relay cannot check the HMAC, so random bytes do)."""
    return SyncBlob(
        vault_id=vault_id,
        memory_id=memory_id,
        device_id=device_id,
        vector_clock=clock,
        ciphertext=b64(size),
        hmac=b64(32),
        created_at=datetime.now(UTC).isoformat(),
        deleted=deleted,
    )


class Sleeps:
    """The injected `sleep`: records every delay, never sleeps."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


class MaxJitter(random.Random):
    """Full jitter pinned to its upper bound, so delays are exact."""

    def random(self) -> float:
        return 1.0


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def admin(relay: Relay, sleeps: Sleeps) -> Iterator[RelayClient]:
    with RelayClient(relay.url, ADMIN_KEY, sleep=sleeps) as client:
        yield client


# -- every method against a real relay ---------------------------------------------


def test_info_health_ready(admin: RelayClient, sleeps: Sleeps) -> None:
    info = admin.info()
    assert info.protocol == "engram-sync/5.1"
    assert info.max_blobs_per_push == 1000
    assert info.max_blob_bytes >= 1_048_576
    assert "cursor" in info.features
    health = admin.health()
    assert health.status == "ok"
    assert health.total_blobs >= 0
    assert admin.ready() is True
    assert sleeps.delays == []


class CountingTransport(httpx.HTTPTransport):
    """A real transport that counts the requests per path."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return super().handle_request(request)


def test_info_is_asked_once_per_client_and_its_copies(relay: Relay) -> None:
    """Issue 36: /v1/info once (features and limits), shared by `with_retries` copies,
    which use the same connection pool."""
    wire = CountingTransport()
    with RelayClient(relay.url, ADMIN_KEY, transport=wire) as client:
        assert client.offers("cursor")
        assert not client.offers("no-such-feature")
        fewer = client.with_retries(0)
        assert (fewer.max_retries, client.max_retries) == (0, 5)
        assert fewer.known_info().max_blob_bytes == client.known_info().max_blob_bytes
        assert fewer.offers("digest")
        fewer.health()
        assert wire.paths == ["/v1/info", "/health"]
        assert fewer._http is client._http  # one pool
    with pytest.raises(ValueError, match="max_retries"):
        client.with_retries(-1)


def test_keyless_client_reaches_public_routes(relay: Relay) -> None:
    with RelayClient(relay.url, None) as client:
        assert client.info().protocol == "engram-sync/5.1"
        assert client.health().status == "ok"
        assert client.ready()
        with pytest.raises(AuthError):
            client.stats(VAULT)


def test_push_then_pull_by_cursor_and_since(admin: RelayClient) -> None:
    pushed = admin.push(VAULT, [blob("m1"), blob("m2"), blob("m3", deleted=True)])
    assert pushed.accepted == 3
    assert pushed.rejected == []
    assert pushed.revoked_devices == []
    assert pushed.cursor == 3

    page = admin.pull(VAULT, cursor=0, limit=2)
    assert [b.memory_id for b in page.blobs] == ["m1", "m2"]
    assert page.has_more is True
    assert page.cursor == 2
    rest = admin.pull(VAULT, cursor=page.cursor)
    assert [(b.memory_id, b.deleted) for b in rest.blobs] == [("m3", True)]
    assert rest.has_more is False
    assert rest.cursor == 3

    legacy = admin.pull(VAULT, since="1970-01-01T00:00:00+00:00")
    assert {b.memory_id for b in legacy.blobs} == {"m1", "m2", "m3"}
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()  # '+' must be escaped
    assert admin.pull(VAULT, since=future).blobs == []
    assert len(admin.pull(VAULT).blobs) == 3


def test_pushed_blobs_come_back_verbatim(admin: RelayClient) -> None:
    sent = blob("m1", 7)
    admin.push(VAULT, [sent])
    [got] = admin.pull(VAULT, cursor=0).blobs
    assert got.seq == 1  # the relay's sequence, additive (PROTOCOL §9)
    assert msgspec.structs.replace(got, seq=msgspec.UNSET) == sent


def test_retried_push_reports_committed_ids_as_rejected(admin: RelayClient) -> None:
    batch = [blob("m1", 5), blob("m2", 5)]
    assert admin.push(VAULT, batch).accepted == 2
    again = admin.push(VAULT, batch)  # what a retry after a lost answer sees
    assert again.accepted == 0
    assert sorted(again.rejected) == ["m1", "m2"]
    assert again.cursor == 2


def test_stats(admin: RelayClient) -> None:
    empty = admin.stats("nobody-pushed-here")
    assert (empty.vault_id, empty.total_blobs, empty.latest_sync) == ("nobody-pushed-here", 0, None)
    newest = blob("m2")
    admin.push(VAULT, [blob("m1"), newest, blob("m3", deleted=True)])
    stats = admin.stats(VAULT)
    assert stats.vault_id == VAULT
    assert stats.total_blobs == 2  # live blobs only
    assert stats.latest_sync is not None


def test_devices_register_and_revoke(admin: RelayClient) -> None:
    assert admin.devices(VAULT).devices == []
    registered = admin.register_device(VAULT, "device-a", "  Laptop  ")
    assert (registered.vault_id, registered.device_id, registered.label) == (
        VAULT,
        "device-a",
        "Laptop",
    )
    assert registered.registered is True
    admin.push(VAULT, [blob("m1", device_id="device-b")])

    roster = admin.devices(VAULT)
    assert roster.vault_id == VAULT
    by_id = {d.device_id: d for d in roster.devices}
    assert by_id["device-a"].label == "Laptop"
    assert by_id["device-b"].blob_count == 1
    assert not any(d.revoked for d in roster.devices)

    revoked = admin.revoke_device(VAULT, "device-b")
    assert (revoked.vault_id, revoked.device_id, revoked.revoked) == (VAULT, "device-b", True)
    assert admin.revoke_device(VAULT, "device-b").revoked is True  # idempotent
    assert {d.device_id: d.revoked for d in admin.devices(VAULT).devices}["device-b"] is True
    refused = admin.push(VAULT, [blob("m2", device_id="device-b")])
    assert refused.accepted == 0
    assert refused.rejected == ["m2"]
    assert refused.revoked_devices == ["device-b"]


# A "/" is escaped too (see test_request_headers_paths_and_queries), but the relay
# routes on the decoded path, so a vault id with "/" answers 404 there.
@pytest.mark.parametrize(
    "vault_id", ["team acme", "ü-vault", "a?b#c&d=e", "50%", "..", "."], ids=repr
)
def test_ids_are_path_escaped(admin: RelayClient, vault_id: str) -> None:
    device_id = f"dev {vault_id}?"
    admin.push(vault_id, [blob("m1", vault_id=vault_id, device_id=device_id)])
    assert admin.stats(vault_id).vault_id == vault_id
    assert admin.stats(vault_id).total_blobs == 1
    assert [b.memory_id for b in admin.pull(vault_id, cursor=0).blobs] == ["m1"]
    assert admin.register_device(vault_id, device_id, "x").vault_id == vault_id
    assert admin.revoke_device(vault_id, device_id).device_id == device_id
    assert admin.devices(vault_id).devices[0].revoked is True


def test_path_segment_escapes_everything() -> None:
    assert path_segment("a/b c?#%") == "a%2Fb%20c%3F%23%25"
    assert path_segment("..") == "%2E%2E"
    assert path_segment(".") == "%2E"
    assert path_segment("a.b") == "a.b"


def test_device_header_records_pull_progress(relay: Relay) -> None:
    device = str(uuid.uuid4())
    with RelayClient(relay.url, ADMIN_KEY, device_id=device) as client:
        client.push(VAULT, [blob("m1", device_id=device), blob("m2", device_id=device)])
        client.pull(VAULT, cursor=0)
    rows = relay.sql(
        "SELECT pulled_cursor FROM devices WHERE vault_id = $1 AND device_id = $2", VAULT, device
    )
    assert [r["pulled_cursor"] for r in rows] == [2]


# -- error mapping against a real relay ---------------------------------------------


def test_unknown_key_is_auth_error_without_retry(relay: Relay, sleeps: Sleeps) -> None:
    key = "en_this-key-does-not-exist-0123456789abcdef"
    with RelayClient(relay.url, key, sleep=sleeps) as client:
        with pytest.raises(AuthError) as caught:
            client.stats(VAULT)
        for method in (lambda: client.push(VAULT, [blob("m1")]), lambda: client.pull(VAULT)):
            with pytest.raises(AuthError):
                method()
    assert caught.value.status == 401
    assert caught.value.code == "unauthorized"
    assert "API key" in caught.value.message
    assert key not in str(caught.value)
    assert key not in repr(caught.value)
    assert sleeps.delays == []


def test_key_for_another_vault_is_forbidden(relay: Relay, sleeps: Sleeps) -> None:
    key = relay.mint("other-vault")
    with RelayClient(relay.url, key, sleep=sleeps) as client:
        with pytest.raises(ForbiddenError) as caught:
            client.pull(VAULT, cursor=0)
        assert not isinstance(caught.value, DeviceRevokedError)
        assert caught.value.status == 403
        assert caught.value.code == "forbidden"
        with pytest.raises(ForbiddenError, match="admin"):
            client.revoke_device("other-vault", "device-a")  # not an admin key
    assert sleeps.delays == []
    assert key not in str(caught.value) + repr(caught.value)


@pytest.mark.parametrize("how", ["route", "device_row"])
def test_revoked_device_key_is_device_revoked(relay: Relay, admin: RelayClient, how: str) -> None:
    device = str(uuid.uuid4())
    key = relay.mint(VAULT, device_id=device)
    with RelayClient(relay.url, key, device_id=device) as client:
        client.push(VAULT, [blob("m1", device_id=device)])
        if how == "route":  # also revokes the key bound to the device
            admin.revoke_device(VAULT, device)
        else:  # the device row alone
            relay.sql(
                "UPDATE devices SET revoked_at = now() WHERE vault_id = $1 AND device_id = $2",
                VAULT,
                device,
            )
        for call in (lambda: client.pull(VAULT, cursor=0), lambda: client.stats(VAULT)):
            with pytest.raises(DeviceRevokedError) as caught:
                call()
            assert isinstance(caught.value, ForbiddenError)
            assert caught.value.code == "device_revoked"
            assert device in caught.value.message


def test_bad_request_is_relay_error_without_retry(admin: RelayClient, sleeps: Sleeps) -> None:
    with pytest.raises(RelayError) as caught:
        admin.push(VAULT, [])
    assert type(caught.value) is RelayError
    assert (caught.value.status, caught.value.code) == (400, "empty_batch")
    with pytest.raises(RelayError) as invalid:
        admin.push(VAULT, [msgspec.structs.replace(blob("m1"), hmac="bm90IDMyIGJ5dGVz")])
    assert invalid.value.code == "invalid_blob"
    assert "blob 0" in invalid.value.message
    assert sleeps.delays == []


def test_quota_exceeded(fresh_database_url: str, start_relay: StartRelay) -> None:
    relay = start_relay(with_limits(base_config(fresh_database_url), quota_bytes=1000))
    with RelayClient(relay.url, ADMIN_KEY) as client:
        client.push(VAULT, [blob("m1", size=300)])  # 400 base64 chars
        with pytest.raises(QuotaExceededError) as caught:
            client.push(VAULT, [blob("m2", size=300), blob("m3", size=300)])
        assert client.stats(VAULT).total_blobs == 1  # nothing of the batch was written
    error = caught.value
    assert (error.status, error.code) == (402, "quota_exceeded")
    assert (error.detail, error.limit, error.used) == ("bytes", 1000, 1200)
    assert error.message.startswith("quota exceeded: bytes (used 1200 of 1000)")
    assert "\n" not in str(error)


def _compact(relay: Relay, vault_id: str) -> int:
    async def go() -> int:
        conn = await asyncpg.connect(to_libpq_url(relay.database_url))
        try:
            return (await compact_vault(conn, vault_id, timedelta(0))).horizon
        finally:
            await conn.close()

    return asyncio.run(go())


def test_stale_cursor_after_compaction_is_resync_required(admin: RelayClient, relay: Relay) -> None:
    admin.push(VAULT, [blob("m1")])
    admin.push(VAULT, [blob("m2", deleted=True)])
    admin.push(VAULT, [blob("m3")])
    assert _compact(relay, VAULT) == 2
    with pytest.raises(ResyncRequiredError) as caught:
        admin.pull(VAULT, cursor=1)
    assert (caught.value.status, caught.value.code, caught.value.horizon) == (
        409,
        "resync_required",
        2,
    )
    assert "cursor 0" in caught.value.message
    full = admin.pull(VAULT, cursor=0)  # what the client does next
    assert [b.memory_id for b in full.blobs] == ["m1", "m3"]


def test_relay_that_is_down(sleeps: Sleeps) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    client = RelayClient(url, ADMIN_KEY, max_retries=3, sleep=sleeps, rng=MaxJitter())
    with client, pytest.raises(RelayUnavailableError) as caught:
        client.stats(VAULT)
    assert sleeps.delays == [0.5, 1.0, 2.0]
    error = caught.value
    assert error.status is None
    assert error.url == url
    assert f"the relay at {url} could not be reached" in str(error)
    assert "after 4 attempts" in str(error)
    assert "check the relay URL and your network" in str(error)
    assert ADMIN_KEY not in str(error) + repr(error)
    with RelayClient(url, ADMIN_KEY, sleep=sleeps) as probe:
        assert probe.ready() is False
    assert len(sleeps.delays) == 3  # ready() makes one attempt


# -- retries and backoff (scripted transport) ----------------------------------------


Step = int | tuple[int, dict[str, str]] | type[httpx.TransportError]
STATS_BODY = {"vault_id": VAULT, "total_blobs": 4, "latest_sync": None}


class Script:
    """An httpx transport answering a scripted sequence, then 200 with `final`."""

    def __init__(self, steps: list[Step], final: Any = STATS_BODY) -> None:
        self.steps = list(steps)
        self.final = final
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if not self.steps:
            if isinstance(self.final, bytes):
                return httpx.Response(200, content=self.final)
            return httpx.Response(200, json=self.final)
        step = self.steps.pop(0)
        if isinstance(step, type):
            raise step("scripted failure", request=request)
        status, headers = step if isinstance(step, tuple) else (step, {})
        body = {"error": f"scripted {status}", "code": "scripted"}
        return httpx.Response(status, json=body, headers=headers)


def scripted(script: Script, sleeps: Sleeps, **kwargs: Any) -> RelayClient:
    kwargs.setdefault("rng", MaxJitter())
    return RelayClient(
        "http://relay.test",
        ADMIN_KEY,
        transport=httpx.MockTransport(script),
        sleep=sleeps,
        **kwargs,
    )


def test_5xx_then_success_backs_off_exponentially(sleeps: Sleeps) -> None:
    script = Script([503, 502, 500, 504])
    with scripted(script, sleeps) as client:
        assert client.stats(VAULT).total_blobs == 4
    assert len(script.requests) == 5
    assert sleeps.delays == [0.5, 1.0, 2.0, 4.0]


def test_backoff_is_capped_at_backoff_max(sleeps: Sleeps) -> None:
    script = Script([503] * 6)
    with scripted(script, sleeps, max_retries=6, backoff_base=1.0, backoff_max=5.0) as client:
        client.stats(VAULT)
    assert sleeps.delays == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


def test_full_jitter_stays_within_the_exponential_cap(sleeps: Sleeps) -> None:
    script = Script([503] * 5)
    with scripted(script, sleeps, rng=random.Random(7)) as client:
        client.stats(VAULT)
    assert len(sleeps.delays) == 5
    for attempt, delay in enumerate(sleeps.delays):
        assert 0 <= delay <= 0.5 * 2**attempt
    assert len(set(sleeps.delays)) == 5  # jittered, not fixed


def test_retry_after_is_honoured_and_capped(sleeps: Sleeps) -> None:
    script = Script(
        [(429, {"Retry-After": "7"}), (503, {"Retry-After": "120"}), (429, {"Retry-After": "x"})]
    )
    with scripted(script, sleeps) as client:
        client.stats(VAULT)
    assert len(script.requests) == 4
    assert sleeps.delays == [7.0, 30.0, 2.0]  # the unparseable one falls back to backoff


def test_connection_errors_and_timeouts_are_retried(sleeps: Sleeps) -> None:
    script = Script(
        [httpx.ConnectError, httpx.ReadTimeout, httpx.RemoteProtocolError, 503],
        final={"accepted": 1, "rejected": [], "revoked_devices": [], "cursor": 1},
    )
    with scripted(script, sleeps) as client:
        assert client.push(VAULT, [blob("m1")]).accepted == 1
    assert len(script.requests) == 5
    assert sleeps.delays == [0.5, 1.0, 2.0, 4.0]
    assert all(r.method == "POST" for r in script.requests)
    assert len({r.content for r in script.requests}) == 1  # the same body every time


def test_5xx_exhausted_is_relay_unavailable(sleeps: Sleeps) -> None:
    script = Script([503] * 10)
    with (
        scripted(script, sleeps, max_retries=2) as client,
        pytest.raises(RelayUnavailableError) as caught,
    ):
        client.stats(VAULT)
    assert len(script.requests) == 3
    assert len(sleeps.delays) == 2
    assert caught.value.status == 503
    message = str(caught.value)
    assert "the relay at http://relay.test could not serve the request: HTTP 503" in message
    assert "scripted 503" in message
    assert "after 3 attempts" in message


def test_429_exhausted_is_rate_limited(sleeps: Sleeps) -> None:
    script = Script([(429, {"Retry-After": "1"})] * 10)
    with (
        scripted(script, sleeps, max_retries=3) as client,
        pytest.raises(RateLimitedError) as caught,
    ):
        client.pull(VAULT, cursor=0)
    assert len(script.requests) == 4
    assert sleeps.delays == [1.0, 1.0, 1.0]
    assert isinstance(caught.value, RelayError)
    assert caught.value.status == 429
    assert caught.value.retry_after == 1.0
    assert "after 4 attempts" in str(caught.value)


def test_max_retries_zero_means_one_attempt(sleeps: Sleeps) -> None:
    script = Script([httpx.ConnectError])
    with scripted(script, sleeps, max_retries=0) as client, pytest.raises(RelayUnavailableError):
        client.info()
    assert len(script.requests) == 1
    assert sleeps.delays == []


@pytest.mark.parametrize("status", [400, 401, 402, 403, 404, 409, 413, 422])
def test_other_4xx_are_never_retried(sleeps: Sleeps, status: int) -> None:
    script = Script([status, 503])
    with scripted(script, sleeps) as client, pytest.raises(RelayError) as caught:
        client.stats(VAULT)
    assert len(script.requests) == 1
    assert sleeps.delays == []
    assert caught.value.status == status


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (401, "unauthorized", AuthError),
        (403, "forbidden", ForbiddenError),
        (403, "device_revoked", DeviceRevokedError),
        (409, "resync_required", ResyncRequiredError),
        (409, "conflict", RelayError),
        (404, "not_found", RelayError),
    ],
)
def test_status_and_code_choose_the_class(
    sleeps: Sleeps, status: int, code: str, expected: type[RelayError]
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"error": "told you", "code": code, "horizon": 9})

    client = RelayClient("http://relay.test", "k" * 40, transport=httpx.MockTransport(answer))
    with client, pytest.raises(RelayError) as caught:
        client.pull(VAULT, cursor=3)
    assert type(caught.value) is expected
    assert (caught.value.status, caught.value.code, caught.value.message) == (
        status,
        code,
        "told you",
    )


def test_quota_body_of_devices() -> None:
    body = {"error": {"code": "quota_exceeded", "detail": "devices", "limit": 2, "used": 3}}
    client = RelayClient(
        "http://relay.test",
        None,
        transport=httpx.MockTransport(lambda r: httpx.Response(402, json=body)),
    )
    with client, pytest.raises(QuotaExceededError) as caught:
        client.push(VAULT, [blob("m1")])
    assert (caught.value.detail, caught.value.limit, caught.value.used) == ("devices", 2, 3)
    assert caught.value.message.startswith("quota exceeded: devices (used 3 of 2)")
    assert "revoke an unused device" in caught.value.message


def test_non_json_error_body(sleeps: Sleeps) -> None:
    page = "<html>\n<body>" + "x" * 500 + "</body></html>"

    def answer(request: httpx.Request) -> httpx.Response:
        status = 418 if request.url.path == "/health" else 502
        return httpx.Response(status, text=page)

    client = RelayClient(
        "http://relay.test", ADMIN_KEY, transport=httpx.MockTransport(answer), sleep=sleeps
    )
    with client:
        with pytest.raises(RelayError) as teapot:
            client.health()
        with pytest.raises(RelayUnavailableError) as gateway:
            client.info()
    message = teapot.value.message
    assert message.startswith("the relay answered HTTP 418: <html> <body>xxx")
    assert len(message) < 260
    assert "\n" not in message
    assert teapot.value.code == "http_418"
    assert "HTTP 502 (<html> <body>xxx" in str(gateway.value)
    assert "\n" not in str(gateway.value)


def test_redirect_is_not_followed() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(301, headers={"Location": "https://relay.test/"})

    client = RelayClient("http://relay.test", ADMIN_KEY, transport=httpx.MockTransport(answer))
    with client, pytest.raises(RelayError, match=re.escape("redirects to https://relay.test/")):
        client.info()


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"vault_id": "v", "total_blobs": "four", "latest_sync": null}', b"[]"],
)
def test_undecodable_success_is_protocol_error(sleeps: Sleeps, body: bytes) -> None:
    script = Script([], final=body)
    with scripted(script, sleeps) as client, pytest.raises(ProtocolError) as caught:
        client.stats(VAULT)
    assert isinstance(caught.value, SyncError)
    assert "VaultStats" in str(caught.value)
    assert "http://relay.test" in str(caught.value)
    assert sleeps.delays == []


def test_protocol_error_names_the_field(sleeps: Sleeps) -> None:
    script = Script([], final={"vault_id": "v", "total_blobs": "four", "latest_sync": None})
    with scripted(script, sleeps) as client, pytest.raises(ProtocolError) as caught:
        client.stats(VAULT)
    assert caught.value.field == "$.total_blobs"


def test_unknown_fields_are_tolerated(sleeps: Sleeps) -> None:
    script = Script([], final={**STATS_BODY, "something_new": [1, 2]})
    with scripted(script, sleeps) as client:
        assert client.stats(VAULT).total_blobs == 4


# -- what goes on the wire ---------------------------------------------------------


def test_request_headers_paths_and_queries(sleeps: Sleeps) -> None:
    script = Script([], final={})
    client = RelayClient(
        "http://relay.test/prefix/",
        ADMIN_KEY,
        device_id="0f3c",
        transport=httpx.MockTransport(script),
    )
    with client:
        for call in (
            lambda: client.pull("a/b", cursor=5, limit=10),
            lambda: client.pull("v", since="2026-01-01T00:00:00+00:00"),
            lambda: client.revoke_device("v", "d/1"),
            lambda: client.register_device("v", "d1", "Laptop"),
        ):
            with pytest.raises(ProtocolError):
                call()
    first = script.requests[0]
    assert first.headers["authorization"] == f"Bearer {ADMIN_KEY}"
    assert first.headers["user-agent"] == f"engram-sync/{__version__}"
    assert first.headers["x-engram-device"] == "0f3c"
    assert first.url.raw_path == b"/prefix/v1/vaults/a%2Fb/pull?cursor=5&limit=10"
    assert script.requests[1].url.params["since"] == "2026-01-01T00:00:00+00:00"
    assert b"%2B00%3A00" in script.requests[1].url.raw_path
    assert script.requests[2].method == "DELETE"
    assert script.requests[2].url.raw_path == b"/prefix/v1/vaults/v/devices/d%2F1"
    register = script.requests[3]
    assert register.url.raw_path == b"/prefix/v1/vaults/v/devices/register"
    assert register.headers["content-type"] == "application/json"
    assert register.content == b'{"device_id":"d1","label":"Laptop"}'


def test_no_authorization_header_without_a_key() -> None:
    script = Script([], final={})
    with RelayClient("http://relay.test", None, transport=httpx.MockTransport(script)) as client:
        assert client.ready() is True
    assert "authorization" not in script.requests[0].headers
    assert "x-engram-device" not in script.requests[0].headers


# -- the API key never leaks ---------------------------------------------------------


def test_key_is_not_in_the_client_repr() -> None:
    key = "en_SuperSecretKeyMaterial0123456789abcdefgh"
    client = RelayClient("https://user:pw@relay.test", key)
    with client:
        text = repr(client) + str(client)
    assert key not in text
    assert key[:6] in text  # a short prefix identifies it
    assert "SuperSecret" not in text
    assert "pw@" not in text


def test_key_echoed_by_a_broken_relay_is_redacted(sleeps: Sleeps) -> None:
    key = "en_SuperSecretKeyMaterial0123456789abcdefgh"

    def echo(request: httpx.Request) -> httpx.Response:
        text = f"bad header: {request.headers['authorization']}"
        status = 400 if request.method == "GET" else 500
        return httpx.Response(status, json={"error": text, "code": "x"})

    client = RelayClient(
        "http://relay.test", key, transport=httpx.MockTransport(echo), sleep=sleeps
    )
    errors: list[SyncError] = []
    with client:
        for call in (lambda: client.stats(VAULT), lambda: client.push(VAULT, [blob("m1")])):
            with pytest.raises(SyncError) as caught:
                call()
            errors.append(caught.value)
    for error in errors:
        assert key not in str(error)
        assert key not in repr(error)
        assert "<api key>" in str(error)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_url": "relay.test"}, "http"),
        ({"base_url": "ftp://relay.test"}, "http"),
        ({"api_key": "key with\nnewline"}, "API key"),
        ({"device_id": "dévice"}, "device_id"),
        ({"max_retries": -1}, "max_retries"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"base_url": "http://relay.test", "api_key": "k" * 20, **kwargs}
    with pytest.raises(ValueError, match=message) as caught:
        RelayClient(**args)
    assert "key with" not in str(caught.value)


def test_errors_are_sync_errors() -> None:
    for cls in (
        AuthError,
        ForbiddenError,
        DeviceRevokedError,
        QuotaExceededError,
        ResyncRequiredError,
        RateLimitedError,
    ):
        assert issubclass(cls, RelayError)
    for cls2 in (RelayError, RelayUnavailableError, ProtocolError):
        assert issubclass(cls2, SyncError)
