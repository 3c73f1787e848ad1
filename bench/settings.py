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


@dataclass(frozen=True)
class Settings:
    """Sizes of one run. `quick` shrinks everything so the run takes seconds."""

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

    @classmethod
    def build(
        cls,
        *,
        quick: bool,
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
        """Defaults for a full run or a quick one; explicit values win."""
        n_ = n if n is not None else (2_000 if quick else 100_000)
        memories_ = memories if memories is not None else (1_000 if quick else 100_000)
        settings = cls(
            quick=quick,
            n=n_,
            duration=duration if duration is not None else (2.0 if quick else 20.0),
            repeats=repeats if repeats is not None else (1 if quick else 3),
            large_vault=large_vault if large_vault is not None else (20_000 if quick else 200_000),
            memories=memories_,
            profile_memories=min(memories_, 1_000 if quick else 20_000),
            sweep_n=min(n_, 1_000 if quick else 20_000),
            sweep_sizes=(100, 250, 500, 1000),
            out=out if out is not None else RESULTS_DIR,
            workers=workers if workers is not None else default_workers(),
            pull_memory_blobs=pull_memory_blobs
            if pull_memory_blobs is not None
            else (24 if quick else 200),
            import_memories=import_memories
            if import_memories is not None
            else (2_000 if quick else 100_000),
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
