"""The three rows of `bench.mcp` at a small size: a real relay process, two devices each
running `engram-sync mcp` over stdio with live sync on, driven by the real `mcp` client
(2 memories crossing), a 300-memory vault recalled in-process, 40 remembers over stdio. It
checks the harness: every row has its numbers and every target a verdict (never a speed:
the machine is shared)."""

from __future__ import annotations

import math
import secrets
from pathlib import Path

from bench import mcp as mcp_bench
from bench.relay_process import RelayProcess
from bench.targets import mcp_targets


def test_the_mcp_rows_at_a_small_size(fresh_database_url: str, tmp_path: Path) -> None:
    size = mcp_bench.Size(memories=2, vault=300, recalls=20, remembers=40)
    key = "bench-" + secrets.token_urlsafe(24)
    with RelayProcess(fresh_database_url, key, tmp_path / "relay.log") as relay:
        result = mcp_bench.measure(tmp_path / "mcp", relay.url, relay.key, size, log=lambda _: None)

    cross = result["remember_to_recall"]
    assert cross["memories"] == 2
    assert 0 < cross["min_ms"] <= cross["p50_ms"] <= cross["p99_ms"] <= cross["max_ms"]
    assert cross["recalls_on_b"] >= 2  # at least the one finding each memory

    recall = result["recall"]
    assert (recall["memories"], recall["recalls"]) == (300, 20)
    assert 0 < recall["p50_ms"] <= recall["p95_ms"] <= recall["max_ms"]
    assert recall["mean_results"] >= 1  # each query is two words of a stored memory

    rate = result["remember_throughput"]
    assert (rate["remembers"], rate["one_at_a_time"]) == (40, 8)
    assert rate["memories_per_s"] > 0
    assert rate["one_at_a_time_per_s"] > 0

    targets = {t.name: t.as_json() for t in mcp_targets(result)}
    assert set(targets) == {
        "mcp_remember_to_recall_p50",
        "mcp_remember_to_recall_p99",
        "mcp_recall_100k",
        "mcp_remember_throughput",
    }
    for target in targets.values():
        assert target["verdict"] in ("PASS", "FAIL")
        assert math.isfinite(target["value"])
