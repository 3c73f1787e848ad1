"""Group commit of pushes: pushes that arrive together share one transaction.

Every vault maps to one of a few lanes; a lane runs at most one push transaction at a
time. Pushes that arrive while it runs wait, and the lane's next transaction takes all
of them (up to a cap of blobs). Alone, a push starts at once: nothing ever waits for
company. Each push is still answered only after the commit that made it durable, and
decided exactly as if the pushes of its group had run one after the other in arrival
order (`relay.store.push`). Under load, N pushes then cost one transaction and one
durable commit instead of N: that is what lets one vault take more than one push per
commit-and-fsync, and a small machine serve many devices.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg

from engram_sync.relay.domain.domain_errors import PushRefusedError, ShuttingDownError
from engram_sync.relay.store.push import PushJob, PushOutcome, PushResult

# The group's transaction: its jobs, and what to call with the results once it committed
# (each push is answered then, not after what the runner does next: the NOTIFY).
GroupRunner = Callable[
    [list[PushJob], Callable[[list[PushResult]], None]], Awaitable[list[PushResult]]
]


@dataclass
class _Waiting:
    job: PushJob
    future: asyncio.Future[PushResult]


class _Lane:
    def __init__(self) -> None:
        self.waiting: deque[_Waiting] = deque()
        self.task: asyncio.Task[None] | None = None


class PushGroups:
    """The lanes of one relay process."""

    def __init__(self, run: GroupRunner, *, lanes: int, max_group_blobs: int) -> None:
        if lanes < 1 or max_group_blobs < 1:
            raise ValueError("lanes and max_group_blobs must be >= 1")
        self._run = run
        self._lanes = [_Lane() for _ in range(lanes)]
        self._max_blobs = max_group_blobs

    async def push(self, job: PushJob) -> PushOutcome:
        """Run `job` in its lane's next transaction; raises its `PushRefusedError` if refused,
        `ShuttingDownError` if the lane stopped first (both answered by relay.http.errors)."""
        lane = self._lanes[zlib.crc32(job.vault_id.encode("utf-8")) % len(self._lanes)]
        waiting = _Waiting(job, asyncio.get_running_loop().create_future())
        lane.waiting.append(waiting)
        if lane.task is None:
            lane.task = asyncio.create_task(self._drain(lane))
        result = await waiting.future
        if isinstance(result, PushRefusedError):
            raise result
        return result

    def _take(self, lane: _Lane) -> list[_Waiting]:
        """The next group: the oldest push, then more while they fit the blob cap."""
        group = [lane.waiting.popleft()]
        blobs = group[0].job.size
        while lane.waiting and blobs + lane.waiting[0].job.size <= self._max_blobs:
            blobs += lane.waiting[0].job.size
            group.append(lane.waiting.popleft())
        return group

    async def _drain(self, lane: _Lane) -> None:
        """Run the lane's groups one after the other until nobody waits."""
        group: list[_Waiting] = []
        try:
            while lane.waiting:
                group = self._take(lane)
                await self._run_group(group)
                group = []
        except BaseException as exc:  # cancelled (shutdown): nobody may wait forever
            for w in [*group, *lane.waiting]:
                _settle(w, exc if isinstance(exc, Exception) else ShuttingDownError())
            lane.waiting.clear()
            raise
        finally:
            lane.task = None

    async def _run_group(self, group: list[_Waiting]) -> None:
        """One transaction for the group; every push gets its result or the failure."""
        try:
            results = await self._run([w.job for w in group], lambda done: _answer(group, done))
        except asyncpg.DataError as exc:
            # A value the database refused rolled the whole group back. Run each push
            # alone, so that one push's bad value fails that push only.
            if len(group) == 1:
                _settle(group[0], exc)
                return
            for w in group:
                await self._run_group([w])
        except Exception as exc:  # the database is unreachable: every push of the group
            for w in group:
                _settle(w, exc)
        else:
            _answer(group, results)  # settled already, unless the runner did not


def _answer(group: list[_Waiting], results: list[PushResult]) -> None:
    """Hand every push of a committed group its result (before the group's NOTIFY)."""
    for w, result in zip(group, results, strict=True):
        _settle(w, result)


def _settle(waiting: _Waiting, outcome: PushResult | Exception) -> None:
    """Hand a push its outcome, unless its request is gone (cancelled) already."""
    if waiting.future.done():
        return
    if isinstance(outcome, PushOutcome | PushRefusedError):
        waiting.future.set_result(outcome)
    else:
        waiting.future.set_exception(outcome)
