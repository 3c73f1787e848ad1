"""The repair-path-under-flood figure of `bench.scan_fairness` at a tiny size: a real relay
process, a real database, a flood vault of 2,000 rows narrowed by 12 clients while another
vault's key asks 5 bucket digests. It checks the harness (the counts, the target's
verdict); the victim being answered in full holds whatever the machine's speed (the
flood's vault holds at most 3 of the process's places), never a latency."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

from bench import ceiling, scan_fairness
from bench.relay_process import RelayProcess
from bench.targets import scan_fairness_target


def test_a_flood_of_narrowings_and_the_victims_digests_are_counted(
    fresh_database_url: str, tmp_path: Path
) -> None:
    key = "bench-" + secrets.token_urlsafe(24)
    with (
        RelayProcess(fresh_database_url, key, tmp_path / "relay.log") as relay,
        asyncio.Runner() as loop,
    ):
        conn = loop.run(ceiling.connect(fresh_database_url))
        try:
            result = scan_fairness.measure_parts(loop, conn, relay.url, 2_000, flooders=12, asks=5)
        finally:
            loop.run(conn.close())
    assert (result["flood_rows"], result["flooders"], result["victim_asks"]) == (2_000, 12, 5)
    assert result["victim_statuses"] == {"200": 5}
    assert result["victim_answered"] == 1.0
    assert result["victim_latency_ms"]["n"] == 5
    assert sum(result["flood_statuses"].values()) >= 12
    target = scan_fairness_target(result).as_json()
    assert (target["name"], target["verdict"]) == ("digest_scan_fairness", "PASS")
    assert scan_fairness.verdict(result).startswith("PASS")
