"""The next pull page asked for ahead (client._sync.ask_ahead, issue 36): its answer is
used only for the very request the pull makes next, its error is raised there as if the
request were made then, and a request the pull no longer wants is waited for (the relay
client is never used by two threads at once) and dropped. Internals, without a relay:
the fetch is a function of ours."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from engram_sync.client._sync.ask_ahead import AskAhead, PullAsk


class Fetches:
    """A fetch that records its requests and the threads running at once."""

    def __init__(self, *, fail: bool = False) -> None:
        self.asked: list[PullAsk] = []
        self.done: list[PullAsk] = []
        self.fail = fail
        self.lock = threading.Lock()

    def __call__(self, ask: PullAsk) -> Any:
        with self.lock:
            self.asked.append(ask)
        time.sleep(0.05)
        self.done.append(ask)
        if self.fail:
            raise RuntimeError(f"no page after {ask.cursor} (test)")
        return ("page after", ask.cursor)


def test_the_answer_asked_ahead_is_used_for_the_same_request_only() -> None:
    fetch = Fetches()
    ahead = AskAhead(fetch)
    try:
        ahead.start(PullAsk(1000, 1000, 0))
        assert ahead.take(PullAsk(1000, 1000, 0)) == ("page after", 1000)
        assert ahead.take(PullAsk(2000, 1000, 0)) is None  # nothing in flight for it
        ahead.start(PullAsk(2000, 1000, 0))
        assert ahead.take(PullAsk(2000, 500, 0)) is None  # another limit: not this answer
        assert fetch.done == [PullAsk(1000, 1000, 0), PullAsk(2000, 1000, 0)]  # waited for
        ahead.start(PullAsk(3000, 1000, 0))
        assert ahead.take(PullAsk(3000, 1000, None)) is None  # another origin
    finally:
        ahead.close()
    assert len(fetch.asked) == 3


def test_an_error_asked_ahead_is_raised_where_the_request_is_made_or_dropped() -> None:
    ahead = AskAhead(Fetches(fail=True))
    try:
        ahead.start(PullAsk(5, 10, None))
        with pytest.raises(RuntimeError, match="no page after 5"):
            ahead.take(PullAsk(5, 10, None))
        ahead.start(PullAsk(6, 10, None))
        assert ahead.take(PullAsk(7, 10, None)) is None  # not wanted: its error dropped
        ahead.start(PullAsk(8, 10, None))
    finally:
        ahead.close()  # waits for the one in flight, drops its error


def test_an_interrupted_pull_does_not_wait_for_a_relay_that_never_answers() -> None:
    """close(wait=False) (a pull ended by Ctrl-C) leaves the request to its daemon thread:
    neither the interrupt nor the interpreter's exit waits for it; close() waits."""
    release = threading.Event()
    asked: list[PullAsk] = []

    def hanging(ask: PullAsk) -> Any:
        asked.append(ask)
        release.wait()
        return ("page after", ask.cursor)

    ahead = AskAhead(hanging)
    ahead.start(PullAsk(1, 10, None))
    (worker,) = [t for t in threading.enumerate() if t.name == "engram-sync-pull-ahead"]
    assert worker.daemon  # the interpreter's exit does not join it
    ahead.close(wait=False)  # returns while the request still hangs
    assert worker.is_alive()
    assert asked == [PullAsk(1, 10, None)]
    release.set()
    worker.join(timeout=10)
    assert not worker.is_alive()
