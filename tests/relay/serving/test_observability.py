"""Request ids, JSON access logs, the dashboard metrics (issue 6) and who may read them."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest

from engram_sync.relay.services.config import RelayConfig, config_from_env
from engram_sync.relay.serving.logs import JsonFormatter
from engram_sync.relay.serving.request_context import RequestIdFilter
from tests.relay.conftest import ADMIN_KEY, METRICS_TOKEN, Relay
from tests.relay.support import Sealer, assert_error, push_ok, serve


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    access = logging.getLogger("engram_sync.relay.access")
    old_level = access.level
    access.setLevel(logging.INFO)
    logging.getLogger().addHandler(handler)
    try:
        yield stream
    finally:
        logging.getLogger().removeHandler(handler)
        access.setLevel(old_level)


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]


def test_request_id_is_echoed_and_logged(relay: Relay, json_log: io.StringIO) -> None:
    with relay.client() as client:
        given = client.get("/v1/vaults/obs/stats", headers={"X-Request-ID": "trace-123"})
        made = client.get("/v1/vaults/obs/stats")
        hostile = client.get(
            "/v1/vaults/obs/stats", headers={"X-Request-ID": "bad id; drop table" * 10}
        )
    assert given.headers["x-request-id"] == "trace-123"
    assert re.fullmatch(r"[0-9a-f]{16}", made.headers["x-request-id"])
    assert re.fullmatch(r"[0-9a-f]{16}", hostile.headers["x-request-id"])  # replaced
    access = [line for line in _lines(json_log) if line["logger"] == "engram_sync.relay.access"]
    traced = [line for line in access if line["request_id"] == "trace-123"]
    assert len(traced) == 1
    assert traced[0]["route"] == "/v1/vaults/{vault_id}/stats"
    assert traced[0]["status"] == 200
    assert traced[0]["key_prefix"] == ADMIN_KEY[:8]
    assert ADMIN_KEY not in json_log.getvalue()  # a prefix, never the key
    assert "obs" not in json.dumps(access)  # route templates, not vault ids


def test_dashboard_metrics(relay: Relay) -> None:
    sealer = Sealer("m")
    with relay.client() as client:
        push_ok(client, "m", sealer.blobs(3))
        push_ok(client, "m", [sealer.blob("mem-0000", 2, deleted=True)])
        pulled = client.get("/v1/vaults/m/pull", params={"cursor": 0, "limit": 1})
        assert pulled.status_code == 200
        time.sleep(0.5)  # the background counters refresh every 0.2 s in tests
        text = relay.scrape()
    assert re.search(r"^engram_relay_tombstones 1\.0$", text, re.M)
    assert re.search(r"^engram_relay_live_blobs 2\.0$", text, re.M)
    # one pull of 1 blob out of a vault at sequence 4: 3 blobs still ahead of it
    assert re.search(r'^engram_relay_pull_lag_blobs_bucket\{le="1\.0"\} 0\.0$', text, re.M)
    assert re.search(r'^engram_relay_pull_lag_blobs_bucket\{le="10\.0"\} 1\.0$', text, re.M)
    # two pushes one after the other: two push transactions of one push each
    assert re.search(r'^engram_relay_push_group_pushes_bucket\{le="1\.0"\} 2\.0$', text, re.M)
    assert re.search(r"^engram_relay_push_group_pushes_count 2\.0$", text, re.M)
    push_route = r'route="/v1/vaults/\{vault_id\}/push"'
    assert re.search(rf"^engram_relay_request_seconds_bucket\{{.*{push_route}", text, re.M)


def test_metrics_need_the_metrics_token(relay: Relay) -> None:
    """Issue 14 (16): /metrics answered anyone. Now only the metrics token opens it; an API
    key, even the operator's, does not."""
    url = f"{relay.url}/metrics"
    refused = [
        {},
        {"Authorization": "Bearer wrong-metrics-token-0123456789"},
        {"Authorization": f"Bearer {METRICS_TOKEN[:-1]}"},
        {"Authorization": f"Bearer {METRICS_TOKEN}x"},
        {"Authorization": f"Basic {METRICS_TOKEN}"},
        {"Authorization": f"Bearer {ADMIN_KEY}"},
    ]
    for headers in refused:
        response = httpx.get(url, headers=headers)
        body = assert_error(response, 401, "unauthorized")
        assert "ENGRAM_RELAY_METRICS_TOKEN" in body["error"]
        assert response.headers["www-authenticate"] == "Bearer"
        assert "engram_relay_" not in response.text
    ok = httpx.get(url, headers={"Authorization": f"bearer  {METRICS_TOKEN}"})
    assert ok.status_code == 200
    assert ok.headers["content-type"].startswith("text/plain")
    assert "engram_relay_requests_total" in ok.text


def test_without_a_token_the_relay_serves_no_metrics(relay_config: RelayConfig) -> None:
    with serve(replace(relay_config, metrics_token=None)) as quiet:
        for key in (None, ADMIN_KEY, METRICS_TOKEN):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            response = httpx.get(f"{quiet.url}/metrics", headers=headers)
            body = assert_error(response, 404, "not_found")
            assert "ENGRAM_RELAY_METRICS_TOKEN" in body["error"]
        assert httpx.get(f"{quiet.url}/health").status_code == 200


def test_the_metrics_token_comes_from_the_environment() -> None:
    url = "postgresql://unused@127.0.0.1:1/none"
    assert config_from_env(url, {}).metrics_token is None
    assert config_from_env(url, {"ENGRAM_RELAY_METRICS_TOKEN": "  "}).metrics_token is None
    config = config_from_env(url, {"ENGRAM_RELAY_METRICS_TOKEN": METRICS_TOKEN})
    assert config.metrics_token == METRICS_TOKEN
    assert METRICS_TOKEN not in repr(config)
    with pytest.raises(ValueError, match="at least 16 characters"):
        config_from_env(url, {"ENGRAM_RELAY_METRICS_TOKEN": "short"})
