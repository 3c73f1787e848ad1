"""Issue 36's client rows (bench.client_e2e.measure_sizes) at a small size: a real relay
process and real vaults, two sizes of 40 and 120 memories. It checks the harness (bulk
sync both ways, the relay API's copy of the same blobs, interleaved one-memory round trips
that arrive) and that every row gets a verdict (never a speed: the machine is shared)."""

from __future__ import annotations

import secrets
from pathlib import Path

from bench import client_e2e
from bench.relay_process import RelayProcess
from bench.targets import client_size_targets


def test_the_client_size_rows_at_a_small_size(fresh_database_url: str, tmp_path: Path) -> None:
    key = "bench-" + secrets.token_urlsafe(24)
    with RelayProcess(fresh_database_url, key, tmp_path / "relay.log") as relay:
        result = client_e2e.measure_sizes(
            tmp_path, relay.url, relay.key, quick=True, log=lambda _: None, sizes=(40, 120)
        )
    assert result["rounds"] == client_e2e.QUICK_ONE_MEMORY_ROUNDS
    assert [s["memories"] for s in result["sizes"]] == [40, 120]
    for size in result["sizes"]:
        assert len(size["one_memory_client_ms_all"]) == len(size["one_memory_api_ms_all"]) == 3
        assert size["one_memory_client_ms"] > size["one_memory_api_ms"] > 0
        assert size["push_vs_api"] > 0
        assert size["pull_apply_vs_api"] > 0
    assert result["one_memory_large_vs_small"] > 0
    targets = {t.name: t.as_json() for t in client_size_targets(result)}
    assert set(targets) == {
        "one_memory_vs_api_small",
        "one_memory_vs_api_large",
        "one_memory_cost_large_vs_small",
        "client_push_vs_api",
        "client_pull_apply_vs_api",
    }
    assert all(t["verdict"] in ("PASS", "FAIL") for t in targets.values())
