"""`python -m bench --relay`: the relay's rows of issue 36 in one run, each a ratio to what
the database alone does in the same run where one exists, each with the machine's load.

- push and pull against the raw ceiling: `Run.throughput`, >= 5 repeats by default here,
  each measured in lockstep (`bench.lockstep`: batch by batch and page by page
  alternating), the median of the per-repeat ratios (targets 0.7 and 0.6);
- p99 of a single-blob push at 32 devices (`Run.latency`) against the p99 of the raw
  upsert of one blob on 32 connections (`bench.ceiling.concurrent_single_upserts`),
  repeats interleaved with the relay's (target <= 3x);
- each relay process's RSS at rest (target <= 100 MiB) and the relay's RSS under 4
  concurrent full pulls of 1 MiB blobs (`bench.pull_memory`, target <= 300 MiB);
- what keeping the digest costs a push (`bench.digest_push`, median of >= 5 rounds,
  target <= 2%).

The full run (`bench.runner`) measures the idle RSS and the raw latency too; this is the
relay's part alone, sized to fit a shared machine (`--n`, `--repeats`, `--duration`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench import ceiling, digest_push, targets
from bench.corpus import Corpus
from bench.database import BenchDatabase
from bench.env import environment
from bench.monitor import ResourceMonitor
from bench.relay_load import headers
from bench.relay_process import RelayProcess
from bench.runner import Run
from bench.settings import Settings
from bench.stats import load_around

Log = Callable[[str], None]
DIGEST_ROUNDS = 5  # issue 36: the digest's cost as the median of >= 5 rounds


def idle_section(monitor: ResourceMonitor, workers: int) -> dict[str, Any]:
    """Each relay process's RSS now (call it at rest, before any load)."""
    return {"workers": workers, "processes": monitor.process_rss_mb()}


def execute(settings: Settings, log: Log) -> dict[str, Any]:
    """The relay's rows: their sections, the loads around each and the judged targets."""
    started = time.perf_counter()
    log(f"sealing {settings.n} realistic blobs (BlobCipher.seal)")
    corpus = Corpus.make(settings.n)
    loads: dict[str, dict[str, float]] = {}
    sections: dict[str, Any] = {"load": loads}
    with BenchDatabase() as db:
        log(f"PostgreSQL {db.server_version} ready ({db.where}; {db.durability})")
        env = environment(postgres_version=db.server_version, postgres_where=db.where,
                          durability=db.durability)  # fmt: skip
        key = "bench-" + secrets.token_urlsafe(24)
        with RelayProcess(db.url, key, db.scratch / "relay.log", workers=settings.workers) as relay:
            monitor = ResourceMonitor(relay.pid, db.postmaster_pid()).start()
            try:
                time.sleep(1.0)  # at rest: started, nothing asked but /ready
                with load_around(loads, "relay_idle"):
                    sections["relay_idle"] = idle_section(monitor, settings.workers)
                with (
                    asyncio.Runner() as loop,
                    httpx.Client(base_url=relay.url, headers=headers(key, "bench-device"),
                                 timeout=120.0) as http,
                ):  # fmt: skip
                    conn = loop.run(ceiling.connect(db.url))
                    try:
                        run = Run(settings, corpus, db, relay, monitor, loop, conn, http, log)
                        with load_around(loads, "throughput"):
                            sections.update(run.throughput())
                        with load_around(loads, "latency"):
                            sections["latency"] = run.latency()[0]
                            sections["raw_latency"] = run.raw_latency()
                        with load_around(loads, "pull_memory"):
                            sections["pull_memory"] = run.pull_memory()
                    finally:
                        loop.run(conn.close())
            finally:
                monitor.stop()
        with load_around(loads, "digest_push"):
            blobs = min(settings.n, digest_push.BATCH * 20)
            sections["digest_push"] = digest_push.measure(
                db, corpus, blobs=blobs, rounds=max(DIGEST_ROUNDS, settings.repeats), log=log
            )
    judged = judge(sections)
    return {"environment": env, "settings": settings.as_json(), "sections": sections,
            "targets": judged, "total_s": time.perf_counter() - started}  # fmt: skip


def judge(sections: dict[str, Any]) -> list[dict[str, Any]]:
    """The relay rows' targets, each with the load around its measurement."""
    loads = sections["load"]
    d = sections["digest_push"]
    rows = [
        *targets.throughput_targets(sections),
        *targets.p99_ratio_targets(
            sections["latency"], sections["raw_latency"], loads.get("latency")
        ),
        targets.idle_rss_target(sections["relay_idle"], loads.get("relay_idle")),
        targets.pull_memory_target(sections["pull_memory"], loads.get("pull_memory")),
        targets.Target(
            "digest_push_overhead",
            f"push seconds with the digest kept / before it - 1, median of "
            f"{len(d['overhead']['values'])} rounds of {d['blobs']:,} blobs",
            d["overhead"]["median"],
            targets.DIGEST_PUSH_OVERHEAD,
            "<=",
            extra_ok=d["digest_kept"] and d["before_keeps_none"],
            detail=targets.loaded(
                "rounds " + ", ".join(f"{v:+.1%}" for v in d["overhead"]["values"]),
                loads.get("digest_push"),
            ),
        ),
    ]
    return [t.as_json() for t in rows]


def write(data: dict[str, Any], out: Path, stem: str, command: str) -> Path:
    """The run's JSON and a short Markdown table of its rows; returns the Markdown's path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    env = data["environment"]
    lines = [
        f"# Relay rows (issue 36): {env.get('git_sha', '?')}, {env.get('started_utc', '?')}",
        "",
        f"`{command}`, {data['settings']['workers']} relay worker(s), "
        f"{data['total_s']:.0f} s; CPU {env.get('cpu_model', '?')}, cores {env.get('cores', '?')}, "
        f"load {env.get('load_average_1m_at_start', 0):.1f} at the start; PostgreSQL "
        f"{env.get('postgresql', '?')} ({env.get('postgresql_durability', '?')}).",
        "",
        "| verdict | row | value | target | detail |",
        "|---|---|---|---|---|",
    ]
    for t in data["targets"]:
        lines.append(f"| {t['verdict']} | {t['name']}: {t['description']} | {t['value']:.3g} "
                     f"| {t['target']} | {t['detail']} |")  # fmt: skip
    md = out / f"{stem}.md"
    md.write_text("\n".join(lines) + "\n")
    return md
