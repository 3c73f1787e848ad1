"""The live sync loop behind `engram-sync watch` and `Vault.watch()` (issue 15;
docs/live-sync.md).

One thread syncs (the vault's connection belongs to it); the feed thread
(client._sync.live_feed) only wakes it. A sync runs when:

- the feed hints that the vault's sequence passed this device's cursor (PROTOCOL §15);
- this device's vault changed: `PRAGMA data_version` (another connection, e.g. another
  program writing engrams.db, committed) or the connection's own `total_changes` (a write
  through this very vault, between two reports) moved, checked every `local_check_s`,
  and at once when the caller sets `wake` (a program that wrote through another
  connection of its own, e.g. the MCP tools, says so instead of waiting for the check);
- the timer: every `interval` seconds, whatever the feed says (a lost hint only delays);
- after a failure, once the backoff is over.

Never more than one sync per `min_sync_gap_s`, whatever the relay sends: a flood of hints
or a feed that keeps reconnecting cannot make the device pull in a loop.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from msgspec.structs import replace

from engram_sync.shared_format.wire import PullResponse

from .._errors import SyncError
from .._session import VaultSession
from .._sync.engine import Syncer
from .._sync.live_feed import (
    READ_TIMEOUT_S,
    FeedMode,
    FeedSignals,
    FeedTiming,
    LiveFeed,
)
from .._sync.reports import SyncReport
from .._vault.store import count_to_push

log = logging.getLogger(__name__)

CONNECTING: Final = "connecting"
CONNECTED: Final = "connected"
CATCHING_UP: Final = "catching up"
OFFLINE: Final = "offline"
POLLING: Final = "polling"


@dataclass(frozen=True)
class LiveStatus:
    """Where a live sync stands, for a status line.

    `state` is one of "connecting" (the feed is not up yet, or reconnecting), "connected"
    (the feed is up and the last sync worked), "catching up" (a sync is running),
    "offline" (the last sync failed; `problem` says why) or "polling" (the relay offers
    no feed here: syncs run on the timer). `mode` is the feed's way of learning of
    changes ("events", "long-poll", "poll"; None before the relay answered).
    """

    state: str
    mode: str | None
    last_sync_at: str | None
    pending: int
    problem: str | None = None


@dataclass(frozen=True)
class LiveTiming:
    """The loop's own delays (tests make them short)."""

    min_sync_gap_s: float = 0.5
    local_check_s: float = 0.5
    failure_backoff_base_s: float = 1.0
    failure_backoff_max_s: float = 60.0


ReportCallback = Callable[[SyncReport], None]
StatusCallback = Callable[[LiveStatus], None]
RetryPolicy = Callable[[SyncError], bool]


class LiveSync:
    """A live sync of one open vault until `stop` is set; `run()` yields each report."""

    def __init__(
        self,
        session: VaultSession,
        *,
        interval: float,
        stop: threading.Event,
        retry: RetryPolicy,
        on_report: ReportCallback | None = None,
        on_status: StatusCallback | None = None,
        timing: LiveTiming | None = None,
        feed_timing: FeedTiming | None = None,
        live: bool = True,
        wake: threading.Event | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError("interval must be positive")
        self.session = session
        self.interval = interval
        self.stop = stop
        self.retry = retry
        self.on_report = on_report or (lambda report: None)
        self.on_status = on_status or (lambda status: None)
        self.timing = timing or LiveTiming()
        self.feed_timing = feed_timing
        self.live = live
        self.signals = FeedSignals(wake)  # `wake` set: look for local writes now
        self._rng = random.Random()  # noqa: S311 (jitter, not crypto)
        self._status: LiveStatus | None = None
        self._failures = 0
        self._problem: str | None = None
        self._pending = 0
        self.syncs = 0

    def run(self) -> Iterator[SyncReport]:
        """Sync until stopped; NotLinkedError at once when the vault is not linked."""
        # the session's pool and /v1/info, shared with its other syncs (issue 36)
        relay = self.session.shared_relay().with_retries(2)
        # a mismatch while others push is what their commits make: the sync their
        # change hint brings checks again (Syncer.digest_when_behind)
        syncer = self.session.syncer(relay, digest_when_behind=False)
        feed = self._start_feed()
        try:
            yield from self._loop(syncer)
        finally:
            if feed is not None:
                feed.stop()

    def _start_feed(self) -> LiveFeed | None:
        if not self.live:
            self.signals.set_link(FeedMode.POLL, False, None)
            return None
        vault_id = self.session.config.vault_id or ""
        state = self.session.state
        return LiveFeed(
            lambda: self.session.relay(timeout=READ_TIMEOUT_S, max_retries=0),
            vault_id,
            lambda: state.cursor,
            self.signals,
            timing=self.feed_timing,
        ).start()

    # -- the loop ---------------------------------------------------------------------------

    def _loop(self, syncer: Syncer) -> Iterator[SyncReport]:
        gap = self.timing.min_sync_gap_s
        last_start = -math.inf
        next_timer = 0.0  # the first sync runs at once
        retry_at = 0.0
        marker: tuple[int, int] | None = None
        while not self.stop.is_set():
            if self.signals.revoked is not None:
                raise syncer.revoked_by_relay(self.signals.revoked)
            now = time.monotonic()
            ready_at = max(last_start + gap, retry_at)
            if now < ready_at:
                self._publish(syncer, running=False)
                self.stop.wait(min(ready_at - now, self.timing.local_check_s))
                continue
            hint = self.signals.take_hint()
            hinted = hint is not None and hint > self.session.state.cursor
            local = marker is not None and self._local_marker() != marker
            retired = self.signals.take_retired()  # PROTOCOL §19: pull now, it says
            if retired:
                syncer.retired_by_relay()
            if not (hinted or local or retired or now >= next_timer):
                if hint is not None:
                    self.signals.hint_done()
                self._publish(syncer, running=False)
                wait = min(self.timing.local_check_s, max(0.0, next_timer - now))
                self.signals.wake.wait(wait)
                self.signals.wake.clear()
                continue
            last_start = now
            # Other connections' commits from here on must start the next sync, even those
            # landing while this one runs (after its push read the vault): the marker keeps
            # the data_version read before the sync, and this connection's own total_changes
            # after it (its own writes, the pull applying, start nothing).
            seen_before = self._local_marker()[0]
            self._pending = sum(count_to_push(self.session.vault.conn))
            self._publish(syncer, running=True)
            try:
                report = syncer.sync(feed_pages=self._feed_pages(hint))
            except SyncError as exc:
                if not self.retry(exc):
                    raise
                self._failures += 1
                self._problem = str(exc)
                delay = self._backoff()
                retry_at = time.monotonic() + delay
                log.warning("sync failed, retrying in %gs: %s", round(delay, 1), exc)
                self._publish(syncer, running=False)
                continue
            finally:
                if hint is not None:
                    self.signals.hint_done()
            self._failures, self._problem = 0, None
            self.syncs += 1
            next_timer = time.monotonic() + self.interval
            marker = (seen_before, self._local_marker()[1])
            self._pending = sum(count_to_push(self.session.vault.conn))
            self._publish(syncer, running=False)
            self.on_report(report)
            yield report

    def _feed_pages(self, hint: int | None) -> dict[int, PullResponse]:
        """The pages the feed carried (docs/live-feed.md "Blobs in the event"), by the
        cursor each follows. One ending below the highest hint says there is more (the
        pull goes on over HTTP from there unless a carried page follows it)."""
        top = max(hint or 0, self.session.state.cursor)
        return {
            after: replace(fed.page, has_more=fed.cursor < top)
            for after, fed in self.signals.take_pages().items()
        }

    def _local_marker(self) -> tuple[int, int]:
        """What moves when this vault's database changes: `PRAGMA data_version` for
        commits of other connections, `total_changes` for this connection's own."""
        conn = self.session.vault.conn
        row = conn.execute("PRAGMA data_version").fetchone()
        return int(row[0]), conn.total_changes

    def _backoff(self) -> float:
        t = self.timing
        cap = min(
            t.failure_backoff_max_s, t.failure_backoff_base_s * 2.0 ** min(self._failures, 32)
        )
        return min(self.interval, cap / 2 + self._rng.uniform(0.0, cap / 2))

    # -- status -----------------------------------------------------------------------------

    def _publish(self, syncer: Syncer, *, running: bool) -> None:
        signals = self.signals
        mode = signals.mode.value if signals.mode is not None else None
        if running:
            state = CATCHING_UP
        elif self._failures:
            state = OFFLINE
        elif signals.mode is FeedMode.POLL:
            state = POLLING
        elif signals.connected and self.syncs:
            state = CONNECTED
        else:
            state = CONNECTING
        problem = self._problem if self._failures else signals.problem
        status = LiveStatus(
            state=state,
            mode=mode,
            last_sync_at=syncer.state.last_sync_at,
            pending=self._pending,
            problem=problem,
        )
        if status != self._status:
            self._status = status
            self.on_status(status)
