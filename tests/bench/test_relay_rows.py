"""The relay rows of issue 36 (bench.relay_rows, bench.targets, bench.ceiling, bench.relay_child):
the harness only, never a speed or a size of this machine."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import asyncpg

from bench import ceiling, targets
from bench.corpus import Corpus
from bench.relay_rows import judge

ROOT = Path(__file__).resolve().parents[2]


def test_the_bench_relay_child_imports_none_of_the_harness() -> None:
    """Every `--workers` process imports the relay child's module again (multiprocessing
    spawn): the harness's dependencies there cost each relay process about 24 MiB, which
    the idle RSS row once showed as 75 MiB at 2 workers."""
    probe = (
        "import sys, bench.relay_child\n"
        "heavy = ('alembic', 'sqlalchemy', 'httpx', 'psutil', 'bench.database', 'asyncpg')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, check=True, timeout=60)  # fmt: skip
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_the_raw_statement_latency_writes_one_new_blob_a_statement(
    fresh_database_url: str,
) -> None:
    corpus = Corpus.make(8)

    async def work() -> tuple[int, int]:
        run = await ceiling.concurrent_single_upserts(
            fresh_database_url, corpus, connections=3, duration=0.3, tag="t"
        )
        conn = await asyncpg.connect(fresh_database_url)
        try:
            rows = await conn.fetchval("SELECT count(*) FROM blobs WHERE vault_id LIKE 'raw-t-%'")
        finally:
            await conn.close()
        return len(run.latencies_ms), rows

    timed, rows = asyncio.run(work())
    assert timed > 0
    assert rows == timed + 3  # every statement a new memory; the 3 warm-ups untimed


def _sections(push: list[float], relay_p99: float, raw_p99: float) -> dict[str, object]:
    def figure(median: float) -> dict[str, float]:
        return {"min": median, "median": median, "max": median}

    latency = {mode: {"p99_ms": figure(relay_p99), "errors": figure(0)}
               for mode in ("vault_per_device", "shared_vault")}  # fmt: skip
    return {
        "load": {"throughput": {"before": 1.5, "after": 2.5}, "latency": {"before": 3, "after": 4}},
        "relay_push": {"blobs": 100, "ratio_to_ceiling": sorted(push)[len(push) // 2],
                       "ratios": {"values": push}},
        "relay_pull": {"blobs": 100, "ratio_to_ceiling": 0.65, "ratios": {"values": [0.65]}},
        "latency": {"devices": 32, **latency},
        "raw_latency": {"connections": 32, "p99_ms": figure(raw_p99)},
        "relay_idle": {"workers": 2, "processes": [
            {"pid": 1, "role": "relay", "rss_mb": 55.0},
            {"pid": 2, "role": "worker", "rss_mb": 101.0},
            {"pid": 3, "role": "worker", "rss_mb": 60.0}]},
        "pull_memory": {"concurrent_pulls": 4, "blobs": 3, "rss_peak_mb": 250.0,
                        "blobs_per_pull": 3, "pages_per_pull": 3, "max_page_bytes": 1},
        "digest_push": {"blobs": 500, "overhead": {"median": 0.01, "values": [0.01, -0.02]},
                        "digest_kept": True, "before_keeps_none": True},
    }  # fmt: skip


def test_the_rows_are_ratios_judged_with_the_load_beside_them() -> None:
    rows = {t["name"]: t for t in judge(_sections([0.6, 0.75, 0.8], 60.0, 25.0))}
    assert rows["relay_push_vs_ceiling"]["value"] == 0.75
    assert rows["relay_push_vs_ceiling"]["verdict"] == "PASS"
    assert "load 1.5 -> 2.5" in rows["relay_push_vs_ceiling"]["detail"]
    assert rows["push_p99_vs_raw_vault_per_device"]["value"] == 60.0 / 25.0
    assert rows["push_p99_vs_raw_vault_per_device"]["verdict"] == "PASS"
    assert "load 3.0 -> 4.0" in rows["push_p99_vs_raw_shared_vault"]["detail"]
    idle = rows["relay_idle_rss"]
    assert (idle["value"], idle["verdict"]) == (101.0, "FAIL")  # the largest process
    assert "all 3 processes 216 MiB" in idle["detail"]
    assert rows["digest_push_overhead"]["verdict"] == "PASS"
    assert rows["relay_rss_concurrent_full_pulls"]["verdict"] == "PASS"
    slow = {t["name"]: t for t in judge(_sections([0.5, 0.6, 0.9], 80.0, 25.0))}
    assert slow["relay_push_vs_ceiling"]["verdict"] == "FAIL"
    assert slow["push_p99_vs_raw_shared_vault"]["verdict"] == "FAIL"
    assert targets.PUSH_CEILING_RATIO == 0.7
    assert targets.PULL_CEILING_RATIO == 0.6
