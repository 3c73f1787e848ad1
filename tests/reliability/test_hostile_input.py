"""Hostile input (issue 8 §4): schemathesis against the relay's own OpenAPI document, over
real HTTP with valid credentials on every route: no response >= 500 and every documented
response matches its schema. Plus hand-written cases schemathesis would not think of."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
)

from engram_sync.relay.domain.ratelimit import RateLimiter
from engram_sync.relay.services.config import RelayConfig
from tests import tiers
from tests.conftest import takes_backend
from tests.relay.conftest import ADMIN_KEY, Relay, RelayThread, base_config
from tests.relay.support import Sealer, migrated_backend_database, wire

FULL = tiers.full()  # --full: the full sizes (tests/tiers.py)
EXAMPLES = 150 if FULL else 40
VAULT = "fuzz-vault"


#: Also on the Citus cluster by default (issue 18, tests/conftest.py): every route fuzzed
#: against the distributed tables too.
pytestmark = pytest.mark.both_databases


@pytest.fixture(scope="module")
@takes_backend
def fuzz_relay(request: pytest.FixtureRequest, postgres_url: str) -> Iterator[tuple[Relay, str]]:
    with migrated_backend_database(request, postgres_url) as url:
        config: RelayConfig = base_config(url)
        server = RelayThread(config).start()
        relay = Relay(server.url, url, config)
        try:
            with relay.client() as client:
                sealer = Sealer(VAULT)
                client.post(
                    f"/v1/vaults/{VAULT}/push", json={"blobs": [wire(b) for b in sealer.blobs(3)]}
                ).raise_for_status()
            with httpx.Client(base_url=relay.url) as anon:
                signed = anon.post(
                    "/auth/signup",
                    json={"email": "fuzz@example.com", "password": "fuzz password 123"},
                )
                signed.raise_for_status()
                session = signed.json()["session_token"]
            yield relay, session
        finally:
            server.stop()


def _open_event_stream(case: Any, base_url: str, headers: dict[str, str]) -> int:
    """PROTOCOL §15's stream sends pings forever, so a whole-body read would never return:
    read the status and the content type, the error body when it is one, then hang up."""
    sent = case.as_transport_kwargs(base_url=base_url, headers=headers)
    with httpx.stream(
        sent["method"], sent["url"], params=sent.get("params"), headers=sent["headers"], timeout=30
    ) as response:
        kind = response.headers.get("content-type", "")
        if response.status_code == 200:
            assert kind.startswith("text/event-stream"), kind
        else:
            assert kind.startswith("application/json"), kind
            assert "code" in response.read().decode() or response.status_code == 405
        return response.status_code


def test_no_server_errors_and_no_schema_violations(fuzz_relay: tuple[Relay, str]) -> None:
    """Every operation of the relay's OpenAPI document, EXAMPLES generated cases each.

    (Driven through schemathesis' Python API: its pytest plugin does not support this
    pytest version.)"""
    relay, session = fuzz_relay
    api = schemathesis.openapi.from_url(f"{relay.url}/schema/openapi.json")
    counts: dict[int, int] = {}
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 30

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            path: str = case.path
            if path == "/auth/logout":
                token = "ses_not-a-live-session"  # keep the session the /account cases use
            else:
                token = session if path.startswith("/account") else ADMIN_KEY
            headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}
            if path.endswith("/events"):  # never ends: its answer is its status and type
                status = _open_event_stream(case, relay.url, headers)
                counts[status] = counts.get(status, 0) + 1
                return
            response = case.call(base_url=relay.url, headers=headers, timeout=30)
            counts[response.status_code] = counts.get(response.status_code, 0) + 1
            case.validate_response(
                response,
                checks=[not_a_server_error, response_schema_conformance, content_type_conformance],
            )

        run()
    total = sum(counts.values())
    statuses = sorted(counts.items())
    print(f"schemathesis: {len(operations)} operations, {total} cases, statuses {statuses}")
    assert total >= 1000 or (not FULL and total >= 600)
    assert not [status for status in counts if status >= 500]


HOSTILE_BODIES = {
    "deeply nested arrays": b'{"blobs":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "deeply nested objects": b'{"blobs":[' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"]}",
    "non-UTF-8 bytes": b'{"blobs":[{"vault_id":"\xff\xfe"}]}',
    "NUL escaped in a string": b'{"blobs":[{"vault_id":"a\\u0000b"}]}',
    "lone surrogate": b'{"blobs":[{"vault_id":"\\ud800"}]}',
    "huge number": b'{"blobs":[{"vector_clock":1' + b"0" * 5000 + b"}]}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_BODIES))
def test_hostile_bodies_get_a_json_4xx(fuzz_relay: tuple[Relay, str], name: str) -> None:
    relay, _ = fuzz_relay
    with relay.client() as client:
        response = client.post(
            f"/v1/vaults/{VAULT}/push",
            content=HOSTILE_BODIES[name],
            headers={"content-type": "application/json"},
        )
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:200])
    assert set(response.json()) >= {"error", "code"}


@pytest.mark.parametrize(
    ("memory_id", "problem"),
    [
        ("tab\tin-id", "control characters"),
        ("nul\x00in-id", "NUL"),
        ("x" * 10_000, "longer than 256"),
        ("", "is empty"),
    ],
)
def test_hostile_ids(fuzz_relay: tuple[Relay, str], memory_id: str, problem: str) -> None:
    relay, _ = fuzz_relay
    blob = wire(Sealer(VAULT).blob("placeholder", 1))
    blob["memory_id"] = memory_id
    with relay.client() as client:
        response = client.post(f"/v1/vaults/{VAULT}/push", json={"blobs": [blob]})
        good = client.post(
            f"/v1/vaults/{VAULT}/push", json={"blobs": [wire(Sealer(VAULT).blob("fine-id", 1))]}
        )
    assert response.status_code == 400
    assert problem in response.json()["error"]
    assert good.status_code == 200  # the positive case next to it


def test_oversized_body_is_413_json(fuzz_relay: tuple[Relay, str]) -> None:
    relay, _ = fuzz_relay
    body = b'{"blobs":["' + b"A" * (relay.config.max_body_bytes + 10) + b'"]}'
    with relay.client() as client:
        response = client.post(
            f"/v1/vaults/{VAULT}/push", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"


class _Unshared(RateLimiter):
    """One bucket's arithmetic: never shared with the fixture's relay on the same database
    (issue 18's sharing among processes: tests/reliability/test_rate_limit_replicas.py)."""

    def share_among(self, processes: int) -> None:
        del processes


def test_rate_limit_holds_under_a_concurrent_burst(fuzz_relay: tuple[Relay, str]) -> None:
    """50 concurrent requests of a rate-5 key: exactly the bucket's 5 get through.

    The relay serving them is real but its limiter's clock only moves when the test
    moves it, so no refill can blur the bound: a burst is exactly the rate (PROTOCOL §5),
    a refill exactly rate x elapsed, capped at the burst. Fails every run (5 of 5) with the
    bucket's capacity raised to rate + 5 (the old bound, 5 + 5 x 10, passed it)."""
    relay, _ = fuzz_relay
    key = relay.mint(VAULT, rate=5)
    clock = [1000.0]
    server = RelayThread(relay.config)
    server.server.config.app.state.relay.limiter = _Unshared(clock=lambda: clock[0])
    server.start()

    def burst(threads: int, each: int) -> list[httpx.Response]:
        def hit(_: int) -> list[httpx.Response]:
            with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}) as c:
                return [c.get(f"/v1/vaults/{VAULT}/stats") for _ in range(each)]

        with ThreadPoolExecutor(threads) as pool:
            return [r for answers in pool.map(hit, range(threads)) for r in answers]

    def allowed(answers: list[httpx.Response]) -> int:
        assert {r.status_code for r in answers} <= {200, 429}
        for refused in (r for r in answers if r.status_code == 429):
            assert refused.json()["code"] == "rate_limited"
            assert int(refused.headers["retry-after"]) >= 1
        return sum(1 for r in answers if r.status_code == 200)

    try:
        first = burst(5, 10)
        assert len(first) == 50
        assert allowed(first) == 5  # the burst, no more
        clock[0] += 0.5  # refills 0.5 x 5 = 2.5 tokens (binary-exact steps only)
        assert allowed(burst(5, 2)) == 2
        assert allowed(burst(1, 1)) == 0  # half a token is not a request
        clock[0] += 60.0  # a long idle refills to the burst, never past it
        assert allowed(burst(5, 4)) == 5
    finally:
        server.stop()
