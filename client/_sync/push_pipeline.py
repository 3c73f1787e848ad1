"""A sync's push batches sent while the next ones are read and sealed (issue 36).

The device reads, encodes and seals batch k+1 (its database connection stays on the
sync's own thread) while one sender thread pushes batch k and waits for the relay; each
answer is settled (rows marked pushed, the cursor moved past our own commit: PROTOCOL §8,
§9) on the sync's thread, in the order the batches were sealed, before more than `depth`
batches are outstanding. One sender, not several: the relay receives the batches one after
another in the order they were sealed, oldest edit first (PROTOCOL §8), as without the
pipeline; what overlaps is this device's work and the relay's.

A batch whose answer raises (a refusal, a revoked device, a retired vault, a network
error) raises from `settle` on the sync's thread; `close` waits for the batch being sent
and drops those not started, whose rows stay pending (their clocks are skipped, which
PROTOCOL §1 allows).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, Self

from engram_sync.shared_format.wire import PushResponse, SyncBlob

#: batches sealed and not yet settled at once: one being sent, one waiting behind it
DEFAULT_DEPTH: Final = 2

Item = tuple[str, str, str | None]  # (memory id, plaintext, modified_at or deleted_at)


@dataclass
class Sent:
    """One batch sealed and handed to the sender."""

    items: list[Item]
    blobs: list[SyncBlob]
    clocks: list[int]
    deleted: bool
    answer: Future[PushResponse]


class PushPipeline:
    """Up to `depth` sealed batches outstanding; `settle` called on each, in order."""

    def __init__(
        self,
        push: Callable[[list[SyncBlob]], PushResponse],
        settle: Callable[[Sent], None],
        *,
        depth: int = DEFAULT_DEPTH,
    ) -> None:
        self._push = push
        self._settle = settle
        self._depth = max(1, depth)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="engram-push")  # no thread yet
        self._outstanding: deque[Sent] = deque()

    def send(
        self, items: list[Item], blobs: list[SyncBlob], clocks: list[int], *, deleted: bool
    ) -> None:
        """Hand a sealed batch to the sender; settle the oldest ones past `depth`. With
        `depth` 1 there is nothing to overlap: the batch is pushed on this thread (no
        hand-over to the sender: a one-memory sync pays for no thread)."""
        answer = self._inline(blobs) if self._depth == 1 else self._pool.submit(self._push, blobs)
        self._outstanding.append(Sent(items, blobs, clocks, deleted, answer))
        while len(self._outstanding) >= self._depth:
            self._settle(self._outstanding.popleft())

    def _inline(self, blobs: list[SyncBlob]) -> Future[PushResponse]:
        answer: Future[PushResponse] = Future()
        try:
            answer.set_result(self._push(blobs))
        except BaseException as exc:  # raised from `settle`, as the sender's would be
            answer.set_exception(exc)
        return answer

    def drain(self) -> None:
        """Settle every batch still outstanding, in order."""
        while self._outstanding:
            self._settle(self._outstanding.popleft())

    def close(self) -> None:
        """Wait for the batch being sent; drop the ones not started."""
        self._outstanding.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
