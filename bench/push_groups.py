"""Push groups over many vaults: the database transaction of one group (relay.store.push).

A group is what the relay's push lane commits at once (relay/services/push_groups.py): under load,
the pushes of many devices, each in a vault of its own. This figure calls
`relay.store.push.push_group` in process on an asyncpg pool (no HTTP), with groups of
1, 8, 32 and 128 vaults, one new blob per vault and push, and reports the median
milliseconds of a group. Every vault exists and holds blobs before the clock starts,
so each timed group takes its locks, reads the stored versions (`_READ_KNOWN`) and
writes. deploy/SCALING.md §3 quotes it (the per-vault read was one round trip a vault).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import asyncpg

from bench.corpus import Corpus
from engram_sync.relay.domain.push_rules import CheckedBlob
from engram_sync.relay.store.push import PushJob, PushLimits, PushResult, Quota, push_group
from engram_sync.shared_format.timestamps import parse_rfc3339

GROUP_VAULTS: Final = (1, 8, 32, 128)
QUICK_ROUNDS: Final = 3
ROUNDS: Final = 30
PushGroup = Callable[[asyncpg.Pool, list[PushJob], PushLimits], Awaitable[list[PushResult]]]
LIMITS: Final = PushLimits(max_blob_bytes=1 << 20, default_quota=Quota(0, 0), announce=False)


def _job(corpus: Corpus, vault_id: str, index: int) -> PushJob:
    blob = corpus.envelope(index, vault_id=vault_id, device_id="group-device", clock=1)
    checked = CheckedBlob(0, blob, parse_rfc3339(blob.created_at), len(blob.ciphertext))
    return PushJob(vault_id=vault_id, checked=[checked], bound_device=None)


class GroupRun:
    """Groups of `vaults` vaults of one tag; each call pushes one new blob per vault."""

    def __init__(self, corpus: Corpus, tag: str, vaults: int) -> None:
        self.corpus = corpus
        self.vault_ids = [f"{tag}-{vaults}-{k:03d}" for k in range(vaults)]
        self.next_index = 0

    def jobs(self) -> list[PushJob]:
        """One new memory per vault (indexes never repeat: every blob is a new one)."""
        jobs = [_job(self.corpus, v, self.next_index + k) for k, v in enumerate(self.vault_ids)]
        self.next_index += len(jobs)
        return jobs

    async def once(self, pool: asyncpg.Pool, push: PushGroup) -> float:
        """Push one group; returns its milliseconds."""
        jobs = self.jobs()
        started = time.perf_counter()
        results = await push(pool, jobs, LIMITS)
        elapsed = (time.perf_counter() - started) * 1000
        accepted = sum(len(r.plan.accepted) for r in results if not isinstance(r, Exception))
        if accepted != len(jobs):
            raise RuntimeError(f"a push group accepted {accepted} of {len(jobs)} blobs")
        return elapsed


async def measure(
    url: str,
    corpus: Corpus,
    *,
    rounds: int,
    tag: str = "group",
    pushes: Sequence[tuple[str, PushGroup]] = (("push_group", push_group),),
    sizes: Sequence[int] = GROUP_VAULTS,
) -> dict[str, Any]:
    """Median ms of a group per size (and per push function, rounds alternating between
    them so that a before/after comparison shares the machine's load)."""
    pool = await asyncpg.create_pool(
        url, min_size=1, max_size=2, server_settings={"timezone": "UTC"}
    )
    try:
        points: list[dict[str, Any]] = []
        for size in sizes:
            runs = {name: GroupRun(corpus, f"{tag}-{name}", size) for name, _ in pushes}
            timings: dict[str, list[float]] = {name: [] for name, _ in pushes}
            for name, push in pushes:  # warm-up: creates the vaults, one blob each
                await runs[name].once(pool, push)
            for _ in range(rounds):
                for name, push in pushes:
                    timings[name].append(await runs[name].once(pool, push))
            point: dict[str, Any] = {"vaults": size}
            for name, _ in pushes:
                point[f"{name}_ms"] = statistics.median(timings[name])
            points.append(point)
        return {"rounds": rounds, "blobs_per_vault": 1, "points": points}
    finally:
        await pool.close()
