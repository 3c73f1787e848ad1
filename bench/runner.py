"""One benchmark run: every measurement, in order, on one database and one relay process."""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import os
import secrets
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx

from bench import (
    agent,
    agent_reads,
    ceiling,
    client_e2e,
    history,
    import_jsonl,
    live_feed,
    live_latency,
    live_throughput,
    lockstep,
    pull_memory,
    web_serve,
    web_vault,
)
from bench import mcp as mcp_bench
from bench import stream_hog as stream_hog_bench
from bench.anti_entropy import measure as measure_anti_entropy
from bench.corpus import Corpus
from bench.database import BenchDatabase
from bench.env import environment
from bench.monitor import ResourceMonitor
from bench.rekey import measure as measure_rekey
from bench.relay_load import (
    LatencyRun,
    concurrent_single_pushes,
    headers,
    incremental_pull_ms,
    pull_all,
    push_all,
    push_bodies,
)
from bench.relay_process import RelayProcess
from bench.settings import (
    DEVICES,
    INCREMENT,
    INCREMENTAL_PULLS,
    PULL_PAGE,
    PUSH_BATCH,
    SMALL_VAULT,
    Settings,
)
from bench.stats import load_around, percentile, rate, summary

Log = Callable[[str], None]
FILL_CHUNK = 20_000  # blobs per prepared chunk while filling the large vault


class Run:
    """The state shared by the measurements of one run."""

    def __init__(
        self,
        settings: Settings,
        corpus: Corpus,
        db: BenchDatabase,
        relay: RelayProcess,
        monitor: ResourceMonitor,
        loop: asyncio.Runner,
        conn: Any,
        http: httpx.Client,
        log: Log,
    ) -> None:
        self.s = settings
        self.corpus = corpus
        self.db = db
        self.relay = relay
        self.monitor = monitor
        self.loop = loop
        self.conn = conn
        self.http = http
        self.log = log

    # -- 1-3: ceiling, relay push, relay pull ---------------------------------------------

    def throughput(self) -> dict[str, Any]:
        """Ceiling write/read and relay push/pull of the same N blobs in lockstep
        (bench.lockstep: batch by batch and page by page alternating, each vault read
        READ_PASSES times after one untimed read), one figure of each per repeat."""
        n = self.s.n
        figures: dict[str, list[float]] = {k: [] for k in ("cw", "cr", "rp", "rl")}
        for r in range(self.s.repeats):
            self.log(f"throughput repeat {r + 1}/{self.s.repeats}: {n} blobs, in lockstep")
            cw, rp, rl, cr = self._lockstep(f"r{r}", n)
            figures["cw"].append(cw)
            figures["rp"].append(rp)
            figures["cr"].append(cr)
            figures["rl"].append(rl)
        write = summary(figures["cw"], "blobs/s")
        read = summary(figures["cr"], "blobs/s")
        push = summary(figures["rp"], "blobs/s")
        pull = summary(figures["rl"], "blobs/s")
        paired_push = [p / w for p, w in zip(figures["rp"], figures["cw"], strict=True)]
        paired_pull = [p / r for p, r in zip(figures["rl"], figures["cr"], strict=True)]
        method = {"lockstep": True, "read_passes": lockstep.READ_PASSES, "warm_reads": 1}
        return {
            "ceiling": {"blobs": n, "batch": PUSH_BATCH, "page": PULL_PAGE,
                        "write_blobs_per_s": write, "read_blobs_per_s": read, **method},
            "relay_push": {"blobs": n, "batch": PUSH_BATCH, "blobs_per_s": push,
                           "ratio_to_ceiling": statistics.median(paired_push),
                           "ratios": summary(paired_push, "x")},
            "relay_pull": {"blobs": n, "page": PULL_PAGE, "blobs_per_s": pull,
                           "ratio_to_ceiling": statistics.median(paired_pull),
                           "ratios": summary(paired_pull, "x"), **method},
        }  # fmt: skip

    def _lockstep(self, tag: str, n: int) -> tuple[float, float, float, float]:
        """(ceiling write, relay push, relay pull, ceiling read) in blobs/s, bench.lockstep."""
        prepared = ceiling.prepare(self.corpus, f"ceiling-{tag}", count=n, batch=PUSH_BATCH)
        bodies = push_bodies(self.corpus, f"push-{tag}", count=n, batch=PUSH_BATCH)
        with self.monitor.phase("lockstep_write"):
            wrote = lockstep.write(self.loop, self.conn, prepared, self.http, f"push-{tag}", bodies)
        del prepared, bodies
        _expect(wrote.relay_items, n, "relay push")
        with self.monitor.phase("lockstep_read"):
            read = lockstep.read(self.loop, self.conn, f"ceiling-{tag}", self.http, f"push-{tag}",
                                 page=PULL_PAGE)  # fmt: skip
        _expect(read.relay_items, n * lockstep.READ_PASSES, "relay pull")
        cw, rp = wrote.rates()
        cr, rl = read.rates()
        return cw, rp, rl, cr

    def _one_size(
        self, tag: str, n: int, batch: int, page: int, *, phases: bool
    ) -> tuple[float, float, float, float]:
        """(ceiling write, relay push, relay pull, ceiling read) in blobs/s for n blobs."""
        phase = self.monitor.phase if phases else lambda name: contextlib.nullcontext()
        prepared = ceiling.prepare(self.corpus, f"ceiling-{tag}", count=n, batch=batch)
        with phase("ceiling_write"):
            cw = rate(n, self.loop.run(ceiling.write(self.conn, prepared)))
        del prepared
        bodies = push_bodies(self.corpus, f"push-{tag}", count=n, batch=batch)
        with phase("relay_push"):
            rp = rate(n, push_all(self.http, f"push-{tag}", bodies))
        del bodies
        with phase("ceiling_read"):
            seconds, rows = self.loop.run(ceiling.read(self.conn, f"ceiling-{tag}", page=page))
        _expect(rows, n, "ceiling read")
        with phase("relay_pull"):
            seconds_pull, blobs = pull_all(self.http, f"push-{tag}", page=page)
        _expect(blobs, n, "relay pull")
        return cw, rp, rate(blobs, seconds_pull), rate(rows, seconds)

    def sweep(self) -> dict[str, Any]:
        """Throughput against batch size (push) and page size (pull), one pass each."""
        if self.s.sweep_n <= 0:
            return {"skipped": True}
        points: list[dict[str, float]] = []
        with self.monitor.phase("sweep"):
            for size in self.s.sweep_sizes:
                points.append(self._sweep_point(size))
        return {"blobs": self.s.sweep_n, "repeats": 1, "points": points}

    def _sweep_point(self, size: int) -> dict[str, float]:
        self.log(f"sweep: batch/page size {size}, {self.s.sweep_n} blobs")
        cw, rp, rl, cr = self._one_size(f"sweep{size}", self.s.sweep_n, size, size, phases=False)
        return {"size": size, "ceiling_write": cw, "relay_push": rp,
                "ceiling_read": cr, "relay_pull": rl}  # fmt: skip

    # -- 4: incremental pull against vault size ---------------------------------------------

    def _vault_with_increment(self, vault_id: str, size: int) -> int:
        """Fill `vault_id` with `size` blobs (raw SQL), then push INCREMENT through the relay;
        returns the cursor just before the increment."""
        for start in range(0, size, FILL_CHUNK):
            count = min(FILL_CHUNK, size - start)
            prepared = ceiling.prepare(
                self.corpus, vault_id, count=count, batch=PUSH_BATCH, start=start,
                first_seq=start + 1,
            )  # fmt: skip
            self.loop.run(ceiling.write(self.conn, prepared))
        self.loop.run(self.conn.execute("ANALYZE blobs"))
        bodies = push_bodies(self.corpus, vault_id, count=INCREMENT, batch=INCREMENT, start=size)
        push_all(self.http, vault_id, bodies)
        return size

    def pull_vs_size(self) -> dict[str, Any]:
        """Incremental pull of INCREMENT new blobs: a small vault against a large one."""
        large = self.s.large_vault
        self.log(f"pull cost vs vault size: filling vaults of {SMALL_VAULT} and {large} blobs")
        with self.monitor.phase("fill_vaults"):
            small_cursor = self._vault_with_increment("size-small", SMALL_VAULT)
            large_cursor = self._vault_with_increment("size-large", large)
        small_ms: list[float] = []
        large_ms: list[float] = []
        for _ in range(self.s.repeats):
            with self.monitor.phase("incremental_pull"):
                for vault, cursor, into in (
                    ("size-small", small_cursor, small_ms),
                    ("size-large", large_cursor, large_ms),
                ):
                    into.append(
                        incremental_pull_ms(
                            self.http, vault, cursor, expected=INCREMENT,
                            times=INCREMENTAL_PULLS, page=PULL_PAGE,
                        )
                    )  # fmt: skip
        small = summary(small_ms, "ms")
        large_summary = summary(large_ms, "ms")
        return {
            "small_vault_blobs": SMALL_VAULT,
            "large_vault_blobs": large,
            "new_blobs": INCREMENT,
            "pulls_per_repeat": INCREMENTAL_PULLS,
            "small_ms": small,
            "large_ms": large_summary,
            "ratio_large_to_small": large_summary["median"] / small["median"],
        }

    # -- 5: latency under concurrency -------------------------------------------------------

    def latency(self) -> tuple[dict[str, Any], dict[str, list[float]]]:
        """Single-blob pushes, closed loop: one device alone (the unloaded baseline, a quarter
        of the duration), then DEVICES devices in one shared vault, then in a vault each."""
        results: dict[str, Any] = {"devices": DEVICES, "duration_s": self.s.duration}
        raw: dict[str, list[float]] = {}
        for mode, duration in (
            ("single_device", max(1.0, self.s.duration / 4)),
            ("shared_vault", self.s.duration),
            ("vault_per_device", self.s.duration),
        ):
            runs: list[LatencyRun] = []
            for r in range(self.s.repeats):
                self.log(f"latency ({mode}) repeat {r + 1}/{self.s.repeats}: {duration:g}s")
                if mode == "single_device":
                    vaults = [f"lat-single-{r}"]
                elif mode == "shared_vault":
                    vaults = [f"lat-shared-{r}"] * DEVICES
                else:
                    vaults = [f"lat-{r}-{k}" for k in range(DEVICES)]
                with self.monitor.phase(f"latency_{mode}"):
                    run = asyncio.run(
                        concurrent_single_pushes(
                            self.relay.url, self.relay.key, self.corpus, vault_ids=vaults,
                            duration=duration,
                        )
                    )  # fmt: skip
                runs.append(run)
            results[mode] = {"devices": len(vaults), "duration_s": duration}
            results[mode].update(_latency_summary(runs))
            raw[mode] = [ms for run in runs for ms in run.latencies_ms]
        return results, raw

    def raw_latency(self) -> dict[str, Any]:
        """Issue 36: the raw upsert of one blob on DEVICES connections, one run of the
        latency test's duration per repeat (bench.ceiling.concurrent_single_upserts): the
        p99 a push's p99 at the same concurrency is judged against."""
        p50: list[float] = []
        p99: list[float] = []
        for r in range(self.s.repeats):
            self.log(
                f"raw statement latency repeat {r + 1}/{self.s.repeats}: {DEVICES} connections"
            )
            with self.monitor.phase("raw_latency"):
                result = self.loop.run(
                    ceiling.concurrent_single_upserts(
                        self.db.url, self.corpus, connections=DEVICES, duration=self.s.duration,
                        tag=f"r{r}",
                    )
                )  # fmt: skip
            ordered = sorted(result.latencies_ms)
            p50.append(percentile(ordered, 50))
            p99.append(percentile(ordered, 99))
        return {"connections": DEVICES, "duration_s": self.s.duration,
                "p50_ms": summary(p50, "ms"), "p99_ms": summary(p99, "ms")}  # fmt: skip

    # -- 8: relay RSS under concurrent full pulls of large blobs ----------------------------

    def pull_memory(self) -> dict[str, Any]:
        """CONCURRENT_PULLS devices pull a vault of 1 MiB blobs at once, every page."""
        blobs = self.s.pull_memory_blobs
        self.log(
            f"relay RSS: {pull_memory.CONCURRENT_PULLS} concurrent full pulls of "
            f"{blobs} blobs of 1 MiB"
        )
        return pull_memory.measure(
            self.loop, self.conn, self.monitor, self.relay.url, self.relay.key, blobs
        )

    # -- 6: client end to end ---------------------------------------------------------------

    def client_e2e(self) -> dict[str, Any]:
        """M memories A → relay → B with the real client; then one profiled run."""
        m = self.s.memories
        results: list[client_e2e.E2EResult] = []
        for r in range(self.s.repeats):
            self.log(f"client end to end repeat {r + 1}/{self.s.repeats}: {m} memories")
            with self.monitor.phase("client_e2e"):
                results.append(
                    client_e2e.run(self.db.scratch, self.relay.url, self.relay.key, f"e2e-{r}", m)
                )
        pm = self.s.profile_memories
        self.log(f"client end to end, profiled: {pm} memories")
        profiles = (cProfile.Profile(), cProfile.Profile())
        with self.monitor.phase("client_e2e_profiled"):
            profiled = client_e2e.run(
                self.db.scratch, self.relay.url, self.relay.key, "e2e-profile", pm,
                profiles=profiles,
            )  # fmt: skip
        return {
            "memories": m,
            "add_s": summary([x.add_s for x in results], "s"),
            "add_memories_per_s": summary([rate(m, x.add_s) for x in results], "memories/s"),
            "push_s": summary([x.push_s for x in results], "s"),
            "push_memories_per_s": summary([rate(m, x.push_s) for x in results], "memories/s"),
            "pull_s": summary([x.pull_s for x in results], "s"),
            "pull_memories_per_s": summary([rate(m, x.pull_s) for x in results], "memories/s"),
            "key_derivation_s": summary([x.keys_a_s for x in results] +
                                        [x.keys_b_s for x in results], "s"),
            "vault_open_s": summary([x.open_a_s for x in results] +
                                    [x.open_b_s for x in results], "s"),
            "profile": {
                "memories": pm,
                "note": "a separate run under cProfile (its own timings are inflated by it)",
                "push_s_profiled": profiled.push_s,
                "pull_s_profiled": profiled.pull_s,
                "push_top_cumulative": client_e2e.top_functions(profiles[0], "cumulative", 15),
                "pull_top_cumulative": client_e2e.top_functions(profiles[1], "cumulative", 15),
                "push_top_tottime": client_e2e.top_functions(profiles[0], "tottime", 10),
                "pull_top_tottime": client_e2e.top_functions(profiles[1], "tottime", 10),
            },
        }  # fmt: skip

    # -- issue 36: a sync costs what changed, not what the vault holds --------------------------

    def client_sizes(self) -> dict[str, Any]:
        """One memory A -> B and the bulk rates, client against relay API, per vault size
        (bench.client_e2e.measure_sizes), on this run's relay."""
        scratch = self.db.scratch / "client-sizes"
        scratch.mkdir(exist_ok=True)
        with self.monitor.phase("client_sizes"):
            return client_e2e.measure_sizes(
                scratch,
                self.relay.url,
                self.relay.key,
                quick=self.s.small_judged_rows,
                log=self.log,
            )

    # -- 13: the live change feed (issue 15) ---------------------------------------------------

    def live_feed(self) -> dict[str, Any]:
        """Idle event streams' RSS, and push -> change hint latency (bench.live_feed)."""
        self.log("live change feed: idle event streams, then push -> wake")
        return live_feed.measure(
            self.loop,
            self.monitor,
            self.relay.url,
            self.relay.key,
            quick=self.s.small_sections,
            database_url=self.db.url,  # the idle streams' query count
            settled=not self.s.small_judged_rows,
        )

    def live_latency(self) -> dict[str, Any]:
        """A's push -> applied in B's vault with the real client, under background load."""
        self.log("live sync latency: real client pairs under connected devices and pushes")
        with self.monitor.phase("live_latency"):
            return live_latency.measure(
                self.relay.url, self.relay.key, self.db.scratch, quick=self.s.small_sections
            )

    def live_throughput(self) -> dict[str, Any]:
        """Push throughput with the feed on and off, alternating rounds (own relays)."""
        self.log("live feed push throughput: ENGRAM_RELAY_LIVE_FEED on / off rounds")
        with self.monitor.phase("live_throughput"):
            return live_throughput.measure(
                self.loop, self.conn, self.corpus, self.db.url, self.relay.key,
                self.db.scratch, workers=self.s.workers, quick=self.s.small_judged_rows,
            )  # fmt: skip

    # -- 13: re-key (issue 16, PROTOCOL §19) ------------------------------------------------

    def rekey(self) -> dict[str, Any]:
        """M memories (the JSONL import's M) re-keyed by the real client (bench.rekey)."""
        m = self.s.import_memories
        self.log(f"re-key: {m} memories (a tenth of them tombstones) to a new passphrase")
        scratch = self.db.scratch / "rekey"
        scratch.mkdir(parents=True, exist_ok=True)
        with self.monitor.phase("rekey"):
            return measure_rekey(scratch, self.relay.url, self.relay.key, m)

    # -- issue 35: the local history (docs/history.md) ----------------------------------------

    def history(self) -> dict[str, Any]:
        """Revert by device on two watching devices, history's cost to an edit and a pull,
        and its storage cap (bench.history), on this run's relay."""
        scratch = self.db.scratch / "history"
        scratch.mkdir(parents=True, exist_ok=True)
        with self.monitor.phase("history"):
            return history.measure(
                scratch, self.relay.url, self.relay.key,
                history.Size.of(quick=self.s.small_sections), self.log,
            )  # fmt: skip

    # -- issue 33: the MCP server (docs/mcp.md) -----------------------------------------------

    def mcp(self) -> dict[str, Any]:
        """Remember on A -> recall on B through two `engram-sync mcp`, recall on a large
        vault, remember throughput over stdio (bench.mcp), on this run's relay."""
        with self.monitor.phase("mcp"):
            return mcp_bench.measure(
                self.db.scratch / "mcp", self.relay.url, self.relay.key,
                mcp_bench.Size.of(quick=self.s.small_sections), self.log,
            )  # fmt: skip

    # -- issue 34: the web vault in Chromium (docs/web-vault.md) ------------------------------

    def web_vault(self) -> dict[str, Any]:
        """Unlock, a 10,000-memory pull and search in the page (bench.web_vault), on this run's
        relay; `{"skipped": reason}` without Chromium or Playwright."""
        with self.monitor.phase("web_vault"):
            return web_vault.measure(
                self.relay.url, self.relay.key,
                web_vault.Size.of(quick=self.s.small_sections), self.log,
            )  # fmt: skip

    def web_serve(self) -> dict[str, Any]:
        """The relay's /vault/ served, `web verify` and the page in Chromium
        (bench.web_serve), on this run's relay."""
        with self.monitor.phase("web_serve"):
            return web_serve.measure(self.relay.url, self.log, quick=self.s.small_sections)

    # -- 11: JSONL import (issue 17) ---------------------------------------------------------

    def jsonl_import(self) -> dict[str, Any]:
        """M memories imported from a JSONL file into a fresh SQLCipher vault, per repeat."""
        m = self.s.import_memories
        runs: list[dict[str, Any]] = []
        for r in range(self.s.repeats):
            self.log(f"JSONL import repeat {r + 1}/{self.s.repeats}: {m} memories")
            scratch = self.db.scratch / f"import-{r}"
            scratch.mkdir(parents=True, exist_ok=True)
            with self.monitor.phase("jsonl_import"):
                runs.append(import_jsonl.measure(scratch, m))
        return {
            "memories": m,
            "batch": runs[0]["batch"],
            "file_bytes": runs[0]["file_bytes"],
            "seconds": summary([run["seconds"] for run in runs], "s"),
            "memories_per_s": summary([run["memories_per_s"] for run in runs], "memories/s"),
            "cpu_s": summary([run["cpu_s"] for run in runs], "s"),  # the import's own CPU
        }


def _expect(got: int, want: int, what: str) -> None:
    if got != want:
        raise RuntimeError(f"{what} returned {got} blobs, expected {want}")


def _latency_summary(runs: list[LatencyRun]) -> dict[str, Any]:
    def per_run(q: float) -> list[float]:
        return [percentile(sorted(run.latencies_ms), q) for run in runs]

    requests = [len(run.latencies_ms) + run.errors for run in runs]
    return {
        "p50_ms": summary(per_run(50), "ms"),
        "p90_ms": summary(per_run(90), "ms"),
        "p99_ms": summary(per_run(99), "ms"),
        "max_ms": summary(per_run(100), "ms"),
        "errors": summary([float(run.errors) for run in runs], "requests"),
        "requests": summary([float(x) for x in requests], "requests"),
        "pushes_per_s": summary(
            [rate(len(run.latencies_ms), run.seconds) for run in runs], "pushes/s"
        ),
        "error_samples": [text for run in runs for text in run.error_samples][:5],
    }


def _relay_memory(monitor: ResourceMonitor, start_mb: float, end_mb: float) -> dict[str, Any]:
    samples = monitor.samples
    step = max(1, len(samples) // 600)
    peak = max((mb for _, mb, _ in samples), default=end_mb)
    return {
        "rss_start_mb": start_mb,
        "rss_peak_mb": peak,
        "rss_end_mb": end_mb,
        "sample_interval_s": monitor.interval,
        "samples": [
            {"t_s": round(t, 2), "rss_mb": round(mb, 2), "phase": phase}
            for t, mb, phase in samples[::step]
        ],
    }


def _measure_all(
    run: Run, settings: Settings, db: BenchDatabase, log: Log
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Every section in order, each with the load before and after it (`sections["load"]`,
    issue 36: targets.judge prints it beside the section's rows)."""
    loads: dict[str, dict[str, float]] = {}
    latencies: dict[str, list[float]] = {}
    small = settings.small_sections

    def latency() -> dict[str, Any]:
        section, raw = run.latency()
        latencies.update(raw)
        return section

    def stream_hog() -> dict[str, Any]:
        log("stream hog: one key tries to hold event streams (issue 31)")
        return stream_hog_bench.measure(db.url, db.scratch, quick=small)

    def unlock_once() -> dict[str, Any]:
        log("unlock once: a command with and without the key agent")
        return agent.measure(db.scratch, agent.QUICK_RUNS if small else agent.RUNS)

    def reads() -> dict[str, Any]:
        log("list and search with the key agent, a larger vault (issue 36)")
        return agent_reads.measure(db.scratch, quick=small)

    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("sweep", run.sweep),
        ("pull_vs_size", run.pull_vs_size),
        ("digest", lambda: measure_anti_entropy(run)),  # fig 12, PROTOCOL §18
        ("latency", latency),
        ("raw_latency", run.raw_latency),  # issue 36
        ("client_e2e", run.client_e2e),
        ("client_sizes", run.client_sizes),  # issue 36
        ("pull_memory", run.pull_memory),
        ("jsonl_import", run.jsonl_import),
        ("rekey", run.rekey),  # issue 16 (bench.rekey)
        ("live_feed", run.live_feed),
        ("live_latency", run.live_latency),
        ("live_throughput", run.live_throughput),
        ("stream_hog", stream_hog),
        ("history", run.history),  # issue 35 (bench.history)
        ("mcp", run.mcp),  # issue 33 (bench.mcp)
        ("web_vault", run.web_vault),  # issue 34 (bench.web_vault)
        ("web_serve", run.web_serve),  # issue 34 slice 3 (bench.web_serve)
        ("agent", unlock_once),  # issue 17, docs/agent.md
        ("agent_reads", reads),  # issue 36
    ]
    with load_around(loads, "throughput"):
        sections = run.throughput()
    for name, step in steps:
        with load_around(loads, name):
            sections[name] = step()
    sections["load"] = loads
    return sections, latencies


def execute(settings: Settings, log: Log) -> dict[str, Any]:
    """Run every measurement; returns the report's data (targets not yet judged)."""

    started = time.perf_counter()
    corpus_size = max(settings.n, settings.sweep_n)
    log(f"sealing {corpus_size} realistic blobs (BlobCipher.seal)")
    corpus_started = time.perf_counter()
    corpus_load: dict[str, dict[str, float]] = {}
    with load_around(corpus_load, "corpus"):  # the padding row's figure
        corpus = Corpus.make(corpus_size)
    corpus_s = time.perf_counter() - corpus_started
    with BenchDatabase() as db:
        log(f"PostgreSQL {db.server_version} ready ({db.where}; {db.durability})")
        env = environment(
            postgres_version=db.server_version,
            postgres_where=db.where,
            durability=db.durability,
        )
        key = "bench-" + secrets.token_urlsafe(24)
        relay_log = db.scratch / "relay.log"
        with RelayProcess(db.url, key, relay_log, workers=settings.workers) as relay:
            log(f"relay pid {relay.pid} ready at {relay.url}")
            monitor = ResourceMonitor(relay.pid, db.postmaster_pid()).start()
            start_mb = monitor.rss_mb()
            load_now = os.getloadavg()[0]
            idle_load = {"before": load_now, "after": load_now}
            idle = {"workers": settings.workers, "processes": monitor.process_rss_mb()}
            try:
                with (
                    asyncio.Runner() as loop,
                    httpx.Client(
                        base_url=relay.url, headers=headers(key, "bench-device"), timeout=120.0
                    ) as http,
                ):
                    conn = loop.run(ceiling.connect(db.url))
                    try:
                        run = Run(settings, corpus, db, relay, monitor, loop, conn, http, log)
                        sections, latencies = _measure_all(run, settings, db, log)
                    finally:
                        loop.run(conn.close())
                time.sleep(1.0)  # idle a moment: "after" is the relay at rest
                end_mb = monitor.rss_mb()
            finally:
                monitor.stop()
    sections["relay_memory"] = _relay_memory(monitor, start_mb, end_mb)
    sections["load"]["relay_idle"] = idle_load
    sections["load"].update(corpus_load)
    sections["relay_idle"] = idle  # issue 36: each relay process at rest
    sections["cpu"] = {name: usage.as_json() for name, usage in monitor.phases.items()}
    sections["peer"] = {
        "available": False,
        "note": "not available: no peer E2EE sync server is installed on this machine",
    }
    return {
        "schema": 1,
        "environment": env,
        "settings": settings.as_json(),
        "corpus": {
            "blobs": corpus.size,
            "mean_ciphertext_base64_chars": corpus.mean_ciphertext_chars(),
            "mean_ciphertext_bytes": corpus.mean_ciphertext_chars() * 3 / 4,
            "padding_overhead": corpus.padding_overhead(),
            "seal_s": corpus_s,
        },
        "sections": sections,
        "latencies_ms": latencies,  # raw, for the plots; dropped from the JSON file
        "total_s": time.perf_counter() - started,
        "load_average_1m_at_end": os.getloadavg()[0],
    }
