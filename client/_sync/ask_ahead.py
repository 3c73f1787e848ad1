"""The next pull page asked for while this one is applied (issue 36; PROTOCOL §9).

A bulk pull waited for the relay, then applied, then waited again. The next page's request
is known as soon as a page is checked (its cursor, the same limit and origin), so it is
sent on a worker thread while the page is verified and applied: httpx waiting on the
socket and SQLite writing release the GIL, so the two overlap on two cores.

The answer is used only for the very request the pull would make next (`PullAsk`), and
only through the same path as an answer fetched then: it is checked (`check_page`) and
every blob verified before anything of it is used. A request the pull no longer wants (the
page led to a full re-pull, a refuted skip, a smaller limit, an error) is waited for and
its answer or error dropped, so the relay client is never used by two threads at once.
One exception: a pull ended by Ctrl-C (or an exit) does not wait for it (`close(wait=
False)`): the request runs on a daemon thread, so a relay that never answers cannot hold
the person's interrupt or the interpreter's exit; nothing of its answer is used.
The relay records its progress record for a page it serves (§12) a page earlier than it
did; docs/pull-progress.md: a device's record ahead of its rows never makes it skip a
deletion, it makes it pull again (`resync_required`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Final

from engram_sync.shared_format.wire import PullResponse

log = logging.getLogger(__name__)

_THREAD_NAME: Final = "engram-sync-pull-ahead"


@dataclass(frozen=True)
class PullAsk:
    """One cursor pull request (`RelayClient.pull`'s arguments that vary)."""

    cursor: int
    limit: int
    origin: int | None


class AskAhead:
    """At most one pull request in flight on a (daemon) thread, started when asked."""

    def __init__(self, fetch: Callable[[PullAsk], PullResponse]) -> None:
        self.fetch = fetch
        self._pending: tuple[PullAsk, Future[PullResponse]] | None = None

    def start(self, ask: PullAsk) -> None:
        """Send `ask` now, on a thread of its own (after any request in flight is done)."""
        self._drop()
        answer: Future[PullResponse] = Future()

        def run() -> None:
            try:
                answer.set_result(self.fetch(ask))
            except BaseException as exc:  # raised where the answer is taken, or dropped
                answer.set_exception(exc)

        threading.Thread(target=run, name=_THREAD_NAME, daemon=True).start()
        self._pending = (ask, answer)

    def take(self, ask: PullAsk) -> PullResponse | None:
        """The answer to `ask` if it was sent ahead (its error raised here, as if it had
        been sent now), else None (and whatever else was in flight is dropped)."""
        if self._pending is not None and self._pending[0] == ask:
            future = self._pending[1]
            self._pending = None
            return future.result()
        self._drop()
        return None

    def _drop(self) -> None:
        if self._pending is None:
            return
        ask, future = self._pending
        self._pending = None
        try:
            future.result()
        except Exception as exc:  # a request the pull no longer wants: its error too
            log.debug("a pull page asked ahead (cursor %d) was not used: %s", ask.cursor, exc)

    def close(self, *, wait: bool = True) -> None:
        """Wait for what is in flight and drop it; with `wait` False (an interrupted pull)
        leave it to end on its own thread, unused."""
        if wait:
            self._drop()
        self._pending = None
