"""A device running the live sync loop (client._flows.live) in a thread of its own, with its
own connection to its vault, as `engram-sync watch` runs it; and waiting for conditions
with generous timeouts (no timed assertions: 2 shared cores)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engram_sync.client._errors import RateLimitedError, RelayUnavailableError, SyncError
from engram_sync.client._flows.live import LiveStatus, LiveSync, LiveTiming
from engram_sync.client._session import VaultSession
from engram_sync.client._sync.live_feed import FeedTiming
from engram_sync.client._sync.reports import SyncReport
from tests.e2e.conftest import PASSPHRASE

# Short delays, so a fallback or a reconnect happens within a test's patience.
FAST_FEED = FeedTiming(
    reconnect_min_s=0.2,
    reconnect_max_s=2.0,
    backoff_base_s=0.2,
    long_poll_wait_s=1,  # a stop waits for the long-poll in flight: keep it short
    long_poll_min_cycle_s=0.2,
    better_mode_retry_s=3600.0,
    hint_wait_s=5.0,
)
NEVER: float = 1e9  # a watch interval no test lives to see: only the feed can explain a sync


def transient(error: SyncError) -> bool:
    return isinstance(error, RelayUnavailableError | RateLimitedError)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@dataclass
class Watcher:
    """`LiveSync.run()` on the vault at `path`, in a thread; `stop()` ends it."""

    path: Path
    interval: float = NEVER
    passphrase: str = PASSPHRASE
    feed_timing: FeedTiming = FAST_FEED
    timing: LiveTiming = field(default_factory=LiveTiming)
    reports: list[SyncReport] = field(default_factory=list)
    statuses: list[LiveStatus] = field(default_factory=list)
    error: BaseException | None = None
    live: LiveSync | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Watcher:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        wait_for(lambda: bool(self.reports) or not self.running, "the first sync of the watch")
        return self

    def _run(self) -> None:
        try:
            with VaultSession.open(self.path, self.passphrase) as session:
                self.live = LiveSync(
                    session,
                    interval=self.interval,
                    stop=self._stop,
                    retry=transient,
                    on_status=self.statuses.append,
                    timing=self.timing,
                    feed_timing=self.feed_timing,
                )
                for report in self.live.run():
                    self.reports.append(report)
        except BaseException as exc:
            self.error = exc

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def applied(self) -> int:
        return sum(r.applied for r in list(self.reports))

    def mode(self) -> str | None:
        assert self.live is not None
        found = self.live.signals.mode
        return found.value if found is not None else None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
            assert not self._thread.is_alive(), "the watch did not stop"
