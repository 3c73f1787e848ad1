"""What one benchmark run measures, and how big: full defaults, or `--quick`."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

RESULTS_DIR: Final = Path(__file__).resolve().parent / "results"

PUSH_BATCH: Final = 500  # PROTOCOL §8: a device pushes at most 500 blobs per request
PULL_PAGE: Final = 1000  # PROTOCOL §5: the relay's default and maximum page
SMALL_VAULT: Final = 1000  # §4 of the brief: the small vault of the pull-cost comparison
INCREMENT: Final = 10  # new blobs pulled incrementally in the pull-cost comparison
INCREMENTAL_PULLS: Final = 25  # timed pulls per repeat; their median is the repeat's figure
DEVICES: Final = 32  # concurrent devices of the latency test


def default_workers() -> int:
    """One relay worker per usable core (at most 8), as a busy relay is deployed."""
    return max(1, min(8, len(os.sched_getaffinity(0))))


# Issue 36: the default run fits in 15 minutes on 2 cores; `--full` gives the sizes the
# figures of docs/benchmarks.md were first measured at (47 minutes under load).
# (n, duration, repeats, large vault, memories, import memories, sweep blobs, 1 MiB blobs)
FULL: Final = (100_000, 20.0, 3, 200_000, 100_000, 100_000, 20_000, 200)
DEFAULT: Final = (20_000, 5.0, 5, 50_000, 10_000, 10_000, 5_000, 100)
QUICK: Final = (2_000, 2.0, 1, 20_000, 1_000, 2_000, 1_000, 24)


@dataclass(frozen=True)
class Settings:
    """Sizes of one run: the default (<= 15 minutes on 2 cores), `full`, or `quick` (seconds).
    The default measures the sections after the relay's figures (client sizes, live feed,
    stream hog, history, MCP, web vault, agent) at their quick sizes (`small_sections`)."""

    quick: bool
    n: int  # blobs of the ceiling / push / pull measurements
    duration: float  # seconds of each latency run
    repeats: int
    large_vault: int  # blobs of the large vault of the pull-cost comparison
    memories: int  # memories of the client end-to-end run
    profile_memories: int  # memories of the (separate) profiled client run
    sweep_n: int  # blobs per point of the batch/page size sweep (0 = no sweep)
    sweep_sizes: tuple[int, ...]
    out: Path
    workers: int = 1  # relay worker processes (`engram-relay serve --workers`)
    pull_memory_blobs: int = 200  # 1 MiB blobs of the concurrent full pulls (bench.pull_memory)
    import_memories: int = 100_000  # memories of the JSONL import (bench.import_jsonl)
    full: bool = False  # `--full`: every section at its full size

    @property
    def small_sections(self) -> bool:
        """Whether the sections with a quick and a full size of their own run the quick one."""
        return not self.full

    @property
    def small_judged_rows(self) -> bool:
        """Whether the rows that a quick size cannot judge run at it anyway: only with
        `--quick`, which checks the harness. They are issue 36's client rows
        (bench.client_e2e.measure_sizes) and the feed's push cost (bench.live_throughput),
        where at the quick sizes one or two batches decide a throughput ratio (a 3% target
        judged on two rounds of 1,000 blobs; a 100,000-memory target on 1,000), and the
        idle streams' query count (bench.live_feed), whose windows must settle 11 s for
        PostgreSQL's deferred counters. At their own sizes they add about 80 s to the
        default run."""
        return self.quick

    @classmethod
    def build(
        cls,
        *,
        quick: bool,
        full: bool = False,
        n: int | None = None,
        duration: float | None = None,
        repeats: int | None = None,
        large_vault: int | None = None,
        memories: int | None = None,
        out: Path | None = None,
        workers: int | None = None,
        pull_memory_blobs: int | None = None,
        import_memories: int | None = None,
    ) -> Settings:
        """Defaults for the default run, a full one or a quick one; explicit values win."""
        if quick and full:
            raise ValueError("--quick and --full exclude each other")
        sizes = QUICK if quick else FULL if full else DEFAULT
        n_, duration_, repeats_, large_, memories_, import_, sweep_, pull_blobs_ = sizes
        n_ = n if n is not None else n_
        memories_ = memories if memories is not None else memories_
        settings = cls(
            quick=quick,
            full=full,
            n=n_,
            duration=duration if duration is not None else duration_,
            repeats=repeats if repeats is not None else repeats_,
            large_vault=large_vault if large_vault is not None else large_,
            memories=memories_,
            profile_memories=min(memories_, 1_000 if quick else 20_000 if full else 5_000),
            sweep_n=min(n_, sweep_),
            sweep_sizes=(100, 250, 500, 1000),
            out=out if out is not None else RESULTS_DIR,
            workers=workers if workers is not None else default_workers(),
            pull_memory_blobs=pull_memory_blobs if pull_memory_blobs is not None else pull_blobs_,
            import_memories=import_memories if import_memories is not None else import_,
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        """Reject sizes the measurements cannot run with."""
        if self.n < PULL_PAGE:
            raise ValueError(f"--n must be at least {PULL_PAGE} (one pull page)")
        if self.duration <= 0:
            raise ValueError("--duration must be > 0")
        if self.repeats < 1:
            raise ValueError("--repeats must be >= 1")
        if self.large_vault <= SMALL_VAULT:
            raise ValueError(f"--large-vault must be larger than the small vault ({SMALL_VAULT})")
        if self.memories < 1:
            raise ValueError("--memories must be >= 1")
        if self.workers < 1:
            raise ValueError("--workers must be >= 1")
        if self.pull_memory_blobs < 1:
            raise ValueError("--pull-memory-blobs must be >= 1")
        if self.import_memories < 1:
            raise ValueError("--import-memories must be >= 1")

    def as_json(self) -> dict[str, Any]:
        """The settings for the report."""
        data = asdict(self)
        data["out"] = str(self.out)
        data["sweep_sizes"] = list(self.sweep_sizes)
        data.update(
            push_batch=PUSH_BATCH,
            pull_page=PULL_PAGE,
            small_vault=SMALL_VAULT,
            increment=INCREMENT,
            incremental_pulls=INCREMENTAL_PULLS,
            devices=DEVICES,
        )
        return data
