"""System routes (PROTOCOL §5, §11) and the JSON error contract for bad input (never a 500).

The module's relay has the smallest body limit the config allows
(max_blob_bytes + 4096), so a 413 needs only a ~1 MB body.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from engram_sync.relay import __version__
from engram_sync.relay.services.config import DEFAULT_MAX_BLOB_BYTES
from tests.relay.conftest import ADMIN_KEY, METRICS_TOKEN, Relay, base_config
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    module_relay,
    new_vault_id,
    pull_ok,
    push,
    push_ok,
    serve,
    wire,
)

MAX_BODY = DEFAULT_MAX_BLOB_BYTES + 4096


@pytest.fixture(scope="module")
def served(postgres_url: str) -> Iterator[Relay]:
    with module_relay(postgres_url, max_body_bytes=MAX_BODY) as relay:
        yield relay


@pytest.fixture
def http(served: Relay) -> Iterator[httpx.Client]:
    with client(served) as c:
        yield c


def test_info_advertises_the_limits(http: httpx.Client) -> None:
    with httpx.Client(base_url=str(http.base_url)) as anonymous:
        response = anonymous.get("/v1/info")
    assert response.status_code == 200
    info = response.json()
    assert info["protocol"] == "engram-sync/5.1"
    assert info["max_blobs_per_push"] == 1000
    assert info["max_blob_bytes"] == DEFAULT_MAX_BLOB_BYTES
    assert info["max_pull_limit"] == 1000
    assert info["max_body_bytes"] == MAX_BODY
    assert isinstance(info["features"], list)
    assert "cursor" in info["features"]
    assert "vault-grants" in info["features"]  # docs/vault-ownership.md
    assert "digest" in info["features"]  # PROTOCOL §18, docs/digest.md
    assert "digest-narrow" in info["features"]  # PROTOCOL §18, ours: POST .../digest/narrow
    assert "idempotency-keys" in info["features"]  # docs/retries.md
    assert {"events", "pull-wait"} <= set(info["features"])  # PROTOCOL §15
    assert "retire" in info["features"]  # PROTOCOL §19, docs/rekey.md


def test_ready_when_the_database_answers(http: httpx.Client) -> None:
    with httpx.Client(base_url=str(http.base_url)) as anonymous:
        response = anonymous.get("/ready")
    assert response.status_code == 200
    assert response.json() == {"status": "ready"}


def wait_for_health(http: httpx.Client, **expected: int) -> dict[str, Any]:
    """Poll /health until its cached counters show `expected` (they refresh in the background)."""
    deadline = time.monotonic() + 30
    while True:
        response = http.get("/health")
        assert response.status_code == 200
        health: dict[str, Any] = response.json()
        if all(health[k] == v for k, v in expected.items()) or time.monotonic() > deadline:
            return health
        time.sleep(0.05)


def test_health_counts_live_blobs_after_a_refresh(relay: Relay) -> None:
    """A relay of its own, so the counters are exactly this test's."""
    with httpx.Client(base_url=relay.url) as anonymous:
        health = wait_for_health(anonymous, vaults=0, total_blobs=0)
        assert health["status"] == "ok"
        first, second = new_vault_id(), new_vault_id()
        with client(relay) as http:
            a, b = Sealer(first), Sealer(second)
            push_ok(http, first, [a.blob("x", 1), a.blob("y", 1), a.blob("z", 1)])
            push_ok(http, second, [b.blob("x", 1), b.blob("gone", 1, deleted=True)])
            push_ok(http, first, [a.blob("y", 2, deleted=True)])
        health = wait_for_health(anonymous, vaults=2, total_blobs=3)
    assert {k: health[k] for k in ("status", "version", "vaults", "total_blobs")} == {
        "status": "ok",
        "version": __version__,
        "vaults": 2,
        "total_blobs": 3,  # x, z in the first vault, x in the second: tombstones excluded
    }
    assert isinstance(health["uptime_secs"], int)
    assert health["uptime_secs"] >= 0
    assert isinstance(health["db_size_bytes"], int)
    assert health["db_size_bytes"] > 0
    assert set(health) >= {"status", "version", "uptime_secs", "vaults", "total_blobs"}


def test_metrics_count_without_naming_vaults_or_keys(served: Relay, http: httpx.Client) -> None:
    vault = new_vault_id("secret-vault-name")
    sealer = Sealer(vault)
    member = served.mint(vault)
    with client(served, member) as member_http:
        push_ok(member_http, vault, [sealer.blob("memory-alpha", 2), sealer.blob("memory-b", 1)])
        push_ok(member_http, vault, [sealer.blob("memory-alpha", 1)])  # stale
        pull_ok(member_http, vault, cursor=0)
        pull_ok(member_http, vault)
    response = http.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for family in (
        "engram_relay_blobs_accepted_total",
        "engram_relay_pushes_total",
        "engram_relay_pulls_total",
        "engram_relay_blobs_pulled_total",
        "engram_relay_requests_total",
        "engram_relay_request_seconds_bucket",
        "engram_relay_vaults",
        "engram_relay_live_blobs",
        "engram_relay_db_pool_connections",
    ):
        assert re.search(rf"^{family}(\{{| )", text, re.MULTILINE), family
    assert re.search(
        r'^engram_relay_blobs_rejected_total\{reason="stale_clock"\} [1-9]', text, re.M
    )
    assert re.search(r'^engram_relay_pulls_total\{mode="cursor"\} [1-9]', text, re.MULTILINE)
    assert 'route="/v1/vaults/{vault_id}/push"' in text  # route templates, not paths
    for secret in (
        vault,
        "secret-vault-name",
        "memory-alpha",
        sealer.device_id,
        member,
        member[:8],
        ADMIN_KEY,
        ADMIN_KEY[:8],
    ):
        assert secret not in text, secret


# --- bad input is JSON, never a bare body, never a 500 ----------------------------------------


def test_unknown_route_is_404_json(http: httpx.Client) -> None:
    assert_error(http.get("/v2/everything"), 404, "not_found")
    assert_error(http.get("/v1/vaults"), 404, "not_found")
    assert_error(http.post("/nowhere", json={}), 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/vaults/v/push"),
        ("PUT", "/v1/vaults/v/push"),
        ("POST", "/v1/vaults/v/pull"),
        ("DELETE", "/v1/vaults/v/stats"),
        ("GET", "/v1/vaults/v/devices/register"),
        ("POST", "/health"),
        ("DELETE", "/v1/info"),
    ],
)
def test_wrong_method_is_405_json(http: httpx.Client, method: str, path: str) -> None:
    assert_error(http.request(method, path), 405, "method_not_allowed")


def test_oversized_body_is_413_json_and_nothing_is_written(
    served: Relay, http: httpx.Client
) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    # Two blobs, each within max_blob_bytes, but together over max_body_bytes.
    blobs = [sealer.sized("a", 1, 600_000), sealer.sized("b", 1, 600_000)]
    body = json.dumps({"blobs": [wire(b) for b in blobs]}).encode()
    assert len(body) > MAX_BODY
    response = http.post(
        f"/v1/vaults/{vault}/push", content=body, headers={"content-type": "application/json"}
    )
    assert_error(response, 413, "payload_too_large")
    assert served.sql("SELECT 1 FROM blobs WHERE vault_id = $1", vault) == []
    # Streamed without a Content-Length: still 413.
    chunked = http.post(
        f"/v1/vaults/{vault}/push",
        content=iter([body[i : i + 65536] for i in range(0, len(body), 65536)]),
        headers={"content-type": "application/json"},
    )
    assert_error(chunked, 413, "payload_too_large")
    # One of them alone fits.
    assert push_ok(http, vault, blobs[:1])["accepted"] == 1


@pytest.mark.parametrize(
    "headers",
    [
        {"content-type": "text/plain"},
        {"content-type": "application/x-www-form-urlencoded"},
        {"content-type": "multipart/form-data; boundary=x"},
        {},
    ],
)
def test_non_json_body_is_415_json(http: httpx.Client, headers: dict[str, str]) -> None:
    vault = new_vault_id()
    body = json.dumps({"blobs": [wire(Sealer(vault).blob("m", 1))]}).encode()
    for path in (f"/v1/vaults/{vault}/push", f"/v1/vaults/{vault}/devices/register"):
        assert_error(http.post(path, content=body, headers=headers), 415, "unsupported_media_type")
    assert http.get(f"/v1/vaults/{vault}/stats").json()["total_blobs"] == 0


def test_json_with_a_charset_is_fine(http: httpx.Client) -> None:
    vault = new_vault_id()
    body = json.dumps({"blobs": [wire(Sealer(vault).blob("m", 1))]}).encode()
    response = http.post(
        f"/v1/vaults/{vault}/push",
        content=body,
        headers={"content-type": "Application/JSON; charset=utf-8"},
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "body",
    [b"{", b"{not json}", b"", b"\xff\xfe\x00", b'{"blobs": [', b"null", b"[]", b'"blobs"', b"42"],
)
@pytest.mark.parametrize("route", ["push", "register"])
def test_malformed_json_is_400_json(http: httpx.Client, body: bytes, route: str) -> None:
    vault = new_vault_id()
    path = f"/v1/vaults/{vault}/push" if route == "push" else f"/v1/vaults/{vault}/devices/register"
    response = http.post(path, content=body, headers={"content-type": "application/json"})
    assert_error(response, 400)


GARBAGE: list[Any] = [
    {"blobs": None},
    {"blobs": {}},
    {"blobs": [None]},
    {"blobs": [[]]},
    {"blobs": [{}]},
    {"blobs": [{"vault_id": ["x"]}]},
    {"blobs": "x" * 10_000},
    {"blobs": [{"vector_clock": 10**30}]},
    {"blobs": [{"vector_clock": 1e308}]},
]


@pytest.mark.parametrize("body", GARBAGE)
def test_garbage_bodies_are_400_never_500(http: httpx.Client, body: Any) -> None:
    response = push(http, new_vault_id(), [])
    assert response.status_code == 400
    response = http.post(f"/v1/vaults/{new_vault_id()}/push", json=body)
    assert_error(response, 400)


def test_unknown_fields_are_tolerated(http: httpx.Client) -> None:
    vault = new_vault_id()
    blob = {**wire(Sealer(vault).blob("m", 1)), "future_field": {"nested": [1, 2]}}
    response = http.post(f"/v1/vaults/{vault}/push", json={"blobs": [blob], "extra": True})
    assert response.status_code == 200, response.text
    (pulled,) = pull_ok(http, vault, cursor=0)["blobs"]
    assert "future_field" not in pulled


@pytest.mark.parametrize(
    "path",
    [
        "/v1/vaults/%00/stats",
        "/v1/vaults/a%0Ab/pull",
        f"/v1/vaults/{'v' * 300}/devices",
        "/sync/%00/stats",
    ],
)
def test_odd_vault_ids_in_paths_are_4xx_json(http: httpx.Client, path: str) -> None:
    response = http.get(path)
    assert 400 <= response.status_code < 500, response.text
    assert_error(response, response.status_code)


# --- the database going away (PROTOCOL §11: /ready 503; never a 500) ---------------------------


class TcpProxy:
    """A loopback TCP proxy to PostgreSQL that can be cut (connections refused) and restored."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.connections: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and reset every open one (like a database crash)."""
        with self.lock:
            if self.listener is not None:
                with contextlib.suppress(OSError):  # wakes the thread blocked in accept()
                    self.listener.shutdown(socket.SHUT_RDWR)
                self.listener.close()
                self.listener = None
            for conn in self.connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self.connections.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                downstream, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                if self.listener is not listener:  # cut meanwhile
                    downstream.close()
                    upstream.close()
                    return
                self.connections += [downstream, upstream]
            for src, dst in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


def test_database_outage_is_503_json_and_recovers(fresh_database_url: str) -> None:
    parts = urlsplit(fresh_database_url)
    assert parts.port is not None
    proxy = TcpProxy(parts.port)
    netloc = parts.netloc.rsplit(":", 1)[0] + f":{proxy.port}"
    proxied = urlunsplit(parts._replace(netloc=netloc))
    vault = new_vault_id()
    sealer = Sealer(vault)
    try:
        with serve(base_config(proxied)) as relay, client(relay) as http:
            assert http.get("/ready").status_code == 200
            push_ok(http, vault, [sealer.blob("before", 1)])
            proxy.cut()
            ready = http.get("/ready")
            assert_error(ready, 503, "unavailable")
            assert int(ready.headers["retry-after"]) >= 1
            assert http.get("/health").status_code == 200  # no database round trip
            for response in (
                push(http, vault, [sealer.blob("during", 1)]),
                http.get(f"/v1/vaults/{vault}/pull", params={"cursor": 0}),
                http.get(f"/v1/vaults/{vault}/stats"),
                http.get(f"/v1/vaults/{vault}/devices"),
            ):
                body = assert_error(response, 503, "unavailable")
                assert "retry" in body["error"]
                assert "retry-after" in response.headers
            proxy.restore()
            deadline = time.monotonic() + 30
            while http.get("/ready").status_code != 200:
                assert time.monotonic() < deadline, "the relay did not reconnect"
                time.sleep(0.05)
            push_ok(http, vault, [sealer.blob("after", 1)])
            pulled = pull_ok(http, vault, cursor=0)["blobs"]
            assert [b["memory_id"] for b in pulled] == ["before", "after"]
    finally:
        proxy.cut()


def test_an_unexpected_server_fault_is_still_a_json_500(relay: Relay) -> None:
    """Not bad input: a broken schema. The answer is JSON and reveals nothing internal."""
    vault = new_vault_id()
    relay.sql("ALTER TABLE blobs RENAME TO blobs_elsewhere")
    try:
        with client(relay) as http:
            response = push(http, vault, [Sealer(vault).blob("m", 1)])
            body = assert_error(response, 500, "internal_error")
            assert "blobs" not in body["error"]
            assert http.get("/ready").status_code == 200  # the database itself is fine
    finally:
        relay.sql("ALTER TABLE blobs_elsewhere RENAME TO blobs")
