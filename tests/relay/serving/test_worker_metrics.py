"""`engram-relay serve --workers 2`: one /metrics scrape sums both workers (issue 14 item 16).

A real `serve` process with two workers on a real database. Requests go over new
connections, which the kernel spreads over the workers' sockets (SO_REUSEPORT,
relay.serving.server); before, each scrape answered with the counters of whichever worker
took it (about half of them).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.relay_process import listening_workers
from engram_sync.relay.serving import server as serving
from tests.relay.cli.test_cli import BIN, _env, _wait_ready
from tests.relay.conftest import METRICS_TOKEN, free_port
from tests.relay.support import wait_for

REQUESTS = 40
POOL_SIZE = 3

pytestmark = pytest.mark.skipif(
    not serving._PER_WORKER_SOCKETS, reason="per-worker sockets are Linux-only"
)


def total(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples with these labels in one scrape."""
    return sum(
        float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def scrape(url: str) -> str:
    response = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert response.status_code == 200, response.text
    return response.text


def info_requests(text: str) -> float:
    return total(text, "engram_relay_requests_total", route="/v1/info", status="200")


def pool_max(text: str) -> float:
    return total(text, "engram_relay_db_pool_connections", state="max")


def test_one_scrape_sums_every_worker(fresh_database_url: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(BIN / "engram-relay"), "serve", "--port", str(port), "--workers", "2",
           "--database-url", fresh_database_url]  # fmt: skip
    env = _env(
        SYNC_API_KEYS="worker-metrics-key-0123456789abcdef:1000",
        ENGRAM_RELAY_METRICS_TOKEN=METRICS_TOKEN,
        ENGRAM_RELAY_POOL_SIZE=str(POOL_SIZE),
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        _wait_ready(url, proc)
        wait_for(lambda: len(listening_workers(proc.pid, port)) == 2, "two listening workers")
        workers = listening_workers(proc.pid, port)
        directory = Path(workers[0].environ()["PROMETHEUS_MULTIPROC_DIR"])
        assert directory == Path(workers[1].environ()["PROMETHEUS_MULTIPROC_DIR"])
        assert directory.stat().st_mode & 0o777 == 0o700  # private to the relay's user

        for _ in range(REQUESTS):  # httpx.get: a new connection each, so both workers serve
            assert httpx.get(f"{url}/v1/info").status_code == 200
        for _ in range(6):  # whichever worker answers a scrape, it counts both
            assert info_requests(scrape(url)) == REQUESTS
        wait_for(lambda: pool_max(scrape(url)) == 2 * POOL_SIZE, "both workers' pool gauges")

        # A worker dies: the supervisor replaces it and drops its live gauges; its
        # requests stay in the counters.
        dead = workers[0].pid
        os.kill(dead, signal.SIGKILL)
        wait_for(
            lambda: (
                {w.pid for w in listening_workers(proc.pid, port)} - {dead}
                and len(listening_workers(proc.pid, port)) == 2
            ),
            "a replacement worker",
        )
        wait_for(
            lambda: not list(directory.glob(f"gauge_live*_{dead}.db")),
            "the dead worker's live gauges to be dropped",
        )
        new = ({w.pid for w in listening_workers(proc.pid, port)} - {workers[1].pid}).pop()
        wait_for(
            lambda: bool(list(directory.glob(f"gauge_livesum_{new}.db"))),
            "the replacement's pool gauges",
        )
        wait_for(lambda: pool_max(scrape(url)) == 2 * POOL_SIZE, "two live pools summed")
        assert info_requests(scrape(url)) == REQUESTS
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not directory.exists()  # the supervisor removes it when it stops
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers)
