"""A sync's push batches sent while the next ones are read and sealed (issue 36).

The device reads, encodes and seals batch k+1 (its database connection stays on the
sync's own thread) while one sender thread pushes batch k and waits for the relay. The
answers are settled (rows marked pushed, the cursor moved past our own commit: PROTOCOL
§8, §9) on the sync's thread, in the order the batches were sealed, `group` batches at a
time (fewer once they hold `GROUP_BYTES` of ciphertext), so that one SQLite transaction
marks them all: a commit rewrites every page a batch dirtied, and the known clocks' index
is keyed by random memory ids, so each batch dirties most of its leaves again. The
`depth - 1` newest batches stay unsettled, in flight, so that the sender has work while a
group is settled. One sender, not several: the relay receives the batches one after
another in the order they were sealed, oldest edit first (PROTOCOL §8), as without the
pipeline; what overlaps is this device's work and the relay's.

A batch whose answer raises (a refusal, a revoked device, a retired vault, a network
error) raises from `settle` on the sync's thread; `close` waits for the batch being sent
and drops those not started, whose rows stay pending (their clocks are skipped, which
PROTOCOL §1 allows). The sender itself sends nothing more once an answer stops the push
(`stops`: an error other than one the sync thread handles and goes on from, or an answer
that names this device revoked), so no batch sealed behind it leaves the device.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, Self

from engram_sync.shared_format.wire import PushResponse, SyncBlob

#: batches in flight while a group is settled: one being sent, two waiting behind it
DEFAULT_DEPTH: Final = 3
#: answered batches settled in one call (one transaction): up to this many ...
DEFAULT_GROUP: Final = 4
#: ... or fewer, once they hold this much ciphertext (what waits unsettled stays bounded)
GROUP_BYTES: Final = 8 * 1024 * 1024

Item = tuple[str, str, str | None]  # (memory id, plaintext, modified_at or deleted_at)


@dataclass
class Sent:
    """One batch sealed and handed to the sender."""

    items: list[Item]
    blobs: list[SyncBlob]
    clocks: list[int]
    deleted: bool
    answer: Future[PushResponse]
    size: int  # the blobs' ciphertext characters


def _ciphertext_size(blobs: list[SyncBlob]) -> int:
    return sum(len(blob.ciphertext) for blob in blobs)


def _an_error(answer: PushResponse | BaseException) -> bool:
    """By default the push stops at an error, never at an answer."""
    return isinstance(answer, BaseException)


class NotSentError(Exception):
    """A batch the sender held back: an earlier answer stopped the push (it is raised by
    that answer's `settle` first, so this one is never settled)."""


class PushPipeline:
    """Up to `depth` sealed batches in flight; `settle` called on the answered ones, in
    order, `group` at a time (fewer past `GROUP_BYTES`, and at `drain`)."""

    def __init__(
        self,
        push: Callable[[list[SyncBlob]], PushResponse],
        settle: Callable[[list[Sent]], None],
        *,
        depth: int = DEFAULT_DEPTH,
        group: int = 1,
        stops: Callable[[PushResponse | BaseException], bool] | None = None,
    ) -> None:
        self._push = push
        self._settle = settle
        self._depth = max(1, depth)
        self._group = max(1, group)
        self._stops = stops or _an_error  # an answer (or error) after which nothing is sent
        self._stopped = False
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="engram-push")  # no thread yet
        self._outstanding: deque[Sent] = deque()

    def send(
        self, items: list[Item], blobs: list[SyncBlob], clocks: list[int], *, deleted: bool
    ) -> None:
        """Hand a sealed batch to the sender; settle the oldest ones past `depth`. With
        `depth` 1 there is nothing to overlap: the batch is pushed on this thread (no
        hand-over to the sender: a one-memory sync pays for no thread)."""
        if self._depth == 1:
            answer = self._inline(blobs)
        else:
            answer = self._pool.submit(self._push_unless_stopped, blobs)
        self._outstanding.append(
            Sent(items, blobs, clocks, deleted, answer, _ciphertext_size(blobs))
        )
        # the oldest batches past the `depth - 1` newest (being sent, or waiting to be)
        settled = len(self._outstanding) - (self._depth - 1)
        if settled >= self._group or self._size(settled) >= GROUP_BYTES:
            self._settle(self._take(settled))

    def _push_unless_stopped(self, blobs: list[SyncBlob]) -> PushResponse:
        """One push, unless an earlier answer stopped the push (on the sender's thread, or
        this one for `depth` 1)."""
        if self._stopped:
            raise NotSentError("an earlier answer stopped the push")
        try:
            answer = self._push(blobs)
        except BaseException as exc:
            self._stopped = self._stops(exc)
            raise
        self._stopped = self._stops(answer)
        return answer

    def _inline(self, blobs: list[SyncBlob]) -> Future[PushResponse]:
        answer: Future[PushResponse] = Future()
        try:
            answer.set_result(self._push_unless_stopped(blobs))
        except BaseException as exc:  # raised from `settle`, as the sender's would be
            answer.set_exception(exc)
        return answer

    def drain(self) -> None:
        """Settle every batch still outstanding, in order, `group` at a time."""
        while self._outstanding:
            self._settle(self._take(self._group))

    def _size(self, count: int) -> int:
        return sum(self._outstanding[i].size for i in range(max(0, count)))

    def _take(self, count: int) -> list[Sent]:
        """Up to `count` oldest batches, fewer once they hold GROUP_BYTES (at least one)."""
        taken = [self._outstanding.popleft()]
        size = taken[0].size
        while len(taken) < count and self._outstanding and size < GROUP_BYTES:
            taken.append(self._outstanding.popleft())
            size += taken[-1].size
        return taken

    def close(self) -> None:
        """Wait for the batch being sent; drop the ones not started."""
        self._outstanding.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
