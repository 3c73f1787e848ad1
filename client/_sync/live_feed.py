"""The live change feed on the device (PROTOCOL §15; docs/live-sync.md).

A thread that tells the watch loop (client._flows.live) when the vault has changed. It
holds the relay's event stream when /v1/info lists `events`; falls back to the long-poll
(`pull?cursor=N&wait=S`, feature `pull-wait`) when the stream is not offered or keeps
failing (a proxy that buffers it, answers 404 or 405); and to nothing at all (the loop
polls on its timer) when neither works. It reconnects with exponential backoff and full
jitter, and never faster than `FeedTiming.reconnect_min_s`.

Everything the relay sends is hostile input: lines and events are bounded
(client._http.sse), and a hint is only a wake-up. Its cursor must be an integer that does
not go back on the stream; anything else is counted as a bad hint and ignored. A valid
hint never moves the device's cursor: the loop pulls with its own cursor, so a relay that
lies in hints can delay the device or make it pull for nothing (bounded by the loop's
pulls per second), never make it skip or adopt anything.

Against a relay listing `events-blobs` the stream is asked with `blobs=1` (ours,
docs/live-feed.md "Blobs in the event"): a change may then carry the blobs committed
since `after`. They are kept as a `FeedPage` for the loop, which hands them to the sync
as the answer of a pull from `after` when that is the device's cursor: checked and
applied exactly like a pull page (client._sync.engine), or dropped for an HTTP pull.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import Enum
from typing import Final

import httpx
import msgspec

from engram_sync.shared_format.wire import MAX_PULL_LIMIT, ChangeEvent, PullResponse

from .._errors import (
    AuthError,
    DeviceRevokedError,
    FeedUnavailableError,
    ForbiddenError,
    RelayError,
    ResyncRequiredError,
    SyncError,
    VaultRetiredError,
    one_line,
)
from .._http.relay_client import EventStream, RelayClient
from .._http.sse import SseEvent, SseParser, SseRetry, SseTooLargeError

log = logging.getLogger(__name__)

EVENTS_FEATURE: Final = "events"
PULL_WAIT_FEATURE: Final = "pull-wait"
EVENTS_BLOBS_FEATURE: Final = "events-blobs"  # ours: events?blobs=1
# A change carrying blobs is larger than a hint (the relay keeps at most 32 KiB of them a
# vault): lines and events of a `blobs=1` stream are bounded all the same.
MAX_BLOBS_EVENT_BYTES: Final = 64 * 1024
MAX_FEED_PAGES: Final = 16  # blob-carrying changes kept for the loop, the newest
MAX_CURSOR: Final = 2**63 - 1
# A read timeout longer than the relay's 15 s ping (PROTOCOL §15), with room for a busy
# machine: a stream silent this long is dead and is dropped.
READ_TIMEOUT_S: Final = 45.0


class FeedMode(Enum):
    """How the device learns of changes."""

    EVENTS = "events"  # the event stream
    LONG_POLL = "long-poll"  # pull?wait=
    POLL = "poll"  # nothing from the relay: the loop's timer


@dataclass(frozen=True)
class FeedTiming:
    """The feed's delays and thresholds (tests make them short)."""

    reconnect_min_s: float = 1.0  # the floor of every reconnect: no spinning
    reconnect_max_s: float = 60.0  # the cap of the backoff (and of the relay's `retry:`)
    backoff_base_s: float = 1.0
    failures_before_fallback: int = 2  # streams in a row that failed before any item
    long_poll_wait_s: int = 25  # S of pull?wait=S (PROTOCOL §15: 0 < S <= 60)
    long_poll_min_cycle_s: float = 1.0  # one long-poll per this many seconds at most
    early_answers_before_poll: int = 3  # empty long-polls answered at once, in a row
    better_mode_retry_s: float = 300.0  # after a fallback, try the better mode again
    hint_wait_s: float = 10.0  # after a hint, how long to wait for the loop to pull


@dataclass(frozen=True)
class FeedPage:
    """The blobs a change event carried: what the relay says a cursor pull from `after`
    gives, up to `cursor`. Unverified: the sync checks it like any pull page."""

    after: int
    cursor: int
    page: PullResponse


class _Outcome(Enum):
    HEALTHY = "healthy"  # it worked, then ended: reconnect soon
    FAILED = "failed"  # it did not work: back off, maybe fall back
    UNSUPPORTED = "unsupported"  # not offered here: fall back now
    FINAL = "final"  # revoked, or the feed was stopped


class FeedSignals:
    """What the feed thread tells the watch loop; every method is thread-safe.

    `wake` is set whenever something changed (a hint, the connection, a revocation), so
    the loop can wait on it; given, it is the caller's event (its owner sets it too).
    """

    def __init__(self, wake: threading.Event | None = None) -> None:
        self.wake = wake if wake is not None else threading.Event()
        self.consumed = threading.Event()
        self._lock = threading.Lock()
        self._hint: int | None = None
        self.mode: FeedMode | None = None
        self.connected = False
        self.revoked: str | None = None
        self._retired = False
        self.problem: str | None = None
        self.bad_hints = 0
        self.hints = 0
        self._pages: dict[int, FeedPage] = {}

    def offer_page(self, page: FeedPage) -> None:
        """Keep a change's blobs for the loop (before its hint, so the loop finds them)."""
        with self._lock:
            self._pages[page.after] = page
            while len(self._pages) > MAX_FEED_PAGES:
                del self._pages[next(iter(self._pages))]

    def take_pages(self) -> dict[int, FeedPage]:
        """The kept pages by `after` (taken: the loop's next sync uses or drops them)."""
        with self._lock:
            pages, self._pages = self._pages, {}
        return pages

    def offer_hint(self, cursor: int) -> None:
        with self._lock:
            self.hints += 1
            self._hint = cursor if self._hint is None else max(self._hint, cursor)
            self.consumed.clear()
        self.wake.set()

    def take_hint(self) -> int | None:
        """The highest hint not yet taken (None: none); the loop takes it when it syncs."""
        with self._lock:
            hint, self._hint = self._hint, None
        return hint

    def hint_done(self) -> None:
        """The loop has pulled after the hints it took."""
        self.consumed.set()

    def bad_hint(self, why: str) -> None:
        with self._lock:
            self.bad_hints += 1
        log.warning("ignored a change hint from the relay: %s", why)

    def set_link(self, mode: FeedMode | None, connected: bool, problem: str | None) -> None:
        with self._lock:
            changed = (self.mode, self.connected, self.problem) != (mode, connected, problem)
            self.mode, self.connected, self.problem = mode, connected, problem
        if changed:
            self.wake.set()

    def set_retired(self) -> None:
        """The relay's `event: retired` (PROTOCOL §19): a wake-up for a sync at once, whose
        pull says whether the vault is retired (a hint only, like a change hint)."""
        with self._lock:
            self._retired = True
        self.wake.set()

    def take_retired(self) -> bool:
        """Whether `event: retired` came since the last call."""
        with self._lock:
            retired, self._retired = self._retired, False
        return retired

    def set_revoked(self, message: str) -> None:
        with self._lock:
            self.revoked = message
        self.wake.set()


def parse_change(data: str, last: int | None) -> tuple[int, FeedPage | None] | str:
    """The cursor of a `change` event's data and the blobs it carried (None: a hint
    only), or why it is not a usable hint. Blobs without a usable `after` (below the
    cursor) or over a page's size leave a hint only."""
    try:
        change = msgspec.json.decode(data, type=ChangeEvent)
    except msgspec.DecodeError as exc:
        return f"not a change hint ({one_line(str(exc))[:120]})"
    cursor = change.cursor
    if cursor < 0 or cursor > MAX_CURSOR:
        return f"cursor {cursor} is outside 0..2^63-1"
    if last is not None and cursor < last:
        return f"cursor {cursor} goes back from {last}"
    after, blobs = change.after, change.blobs
    if not isinstance(after, int) or isinstance(blobs, msgspec.UnsetType):
        return cursor, None
    if not (after < cursor and 0 < len(blobs) <= MAX_PULL_LIMIT):
        return cursor, None
    page = PullResponse(
        blobs=blobs, has_more=False, cursor=cursor, generation=change.generation, head=cursor
    )
    return cursor, FeedPage(after, cursor, page)


class LiveFeed:
    """The feed thread for one vault: `start()`, then `stop()` (joins it)."""

    def __init__(
        self,
        open_client: Callable[[], RelayClient],
        vault_id: str,
        cursor: Callable[[], int],
        signals: FeedSignals,
        *,
        timing: FeedTiming | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._open_client = open_client
        self._vault_id = vault_id
        self._cursor = cursor
        self.signals = signals
        self.timing = timing or FeedTiming()
        self._rng = rng or random.Random()  # noqa: S311 (jitter, not crypto)
        self._stop = threading.Event()
        self._stream: EventStream | None = None
        self._stream_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="engram-sync-feed", daemon=True)
        self._failures = 0
        self._streams = 0  # streams opened, for tests and the status line
        self._long_polls = 0
        self._carry = False  # ask for blobs in the events (the relay lists events-blobs)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> LiveFeed:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread: an open stream is shut down, so a blocked read returns."""
        self._stop.set()
        with self._stream_lock:
            if self._stream is not None:
                self._stream.abort()
        self._thread.join(timeout)

    @property
    def streams_opened(self) -> int:
        return self._streams

    @property
    def long_polls(self) -> int:
        return self._long_polls

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            with self._open_client() as client:
                self._serve(client)
        except Exception:  # the feed must never take the watch down: it polls then
            log.exception("the live change feed stopped; syncing on the timer only")
            self.signals.set_link(FeedMode.POLL, False, "the live feed stopped (see the log)")

    def _serve(self, client: RelayClient) -> None:
        offered = self._offered(client)
        if offered is None:
            return
        self._carry = EVENTS_BLOBS_FEATURE in offered
        mode = self._best_mode(offered)
        fell_back_at = time.monotonic()  # when the mode in use became a worse one
        while not self._stop.is_set():
            retry_at = fell_back_at + self.timing.better_mode_retry_s
            if mode is not FeedMode.EVENTS and time.monotonic() >= retry_at:
                # Issue 15: out of the event stream (a fallback, or a relay that offered
                # none) for better_mode_retry_s: ask /v1/info again (the relay or its
                # proxy may have changed) and start over from the best mode it offers.
                fresh = self._offered(client)
                if fresh is None:
                    return
                offered, mode = fresh, self._best_mode(fresh)
                self._carry = EVENTS_BLOBS_FEATURE in offered
                fell_back_at, self._failures = time.monotonic(), 0
                log.info("live feed: trying %s again", mode.value)
                continue
            if mode is FeedMode.POLL:
                self.signals.set_link(FeedMode.POLL, False, self.signals.problem)
                if self._pause(max(0.0, retry_at - time.monotonic())):
                    return
                continue
            if mode is FeedMode.EVENTS:
                outcome = self._stream_once(client)
            else:
                outcome = self._long_poll(client, until=retry_at)
            if outcome is _Outcome.FINAL:
                return
            if outcome is _Outcome.HEALTHY:
                continue  # _stream_once waited before the reconnect and kept the count
            self._failures += 1
            worse = self._fallback(mode, offered)
            if worse is not mode and (
                outcome is _Outcome.UNSUPPORTED
                or self._failures >= self.timing.failures_before_fallback
            ):
                log.info("live feed: %s not usable here, using %s", mode.value, worse.value)
                mode, fell_back_at, self._failures = worse, time.monotonic(), 0
                continue
            if self._pause(self._backoff()):
                return

    def _offered(self, client: RelayClient) -> frozenset[str] | None:
        """The relay's features (PROTOCOL §11), asked until it answers; None when stopped.
        A relay without /v1/info offers no feed."""
        attempt = 0
        while not self._stop.is_set():
            try:
                return frozenset(client.info().features)
            except RelayError as exc:
                if exc.status in (404, 405, 501):
                    return frozenset()
                problem = str(exc)
            except SyncError as exc:
                problem = str(exc)
            self.signals.set_link(None, False, one_line(problem)[:200])
            attempt += 1
            if self._pause(self._backoff(attempt)):
                return None
        return None

    @staticmethod
    def _best_mode(offered: frozenset[str]) -> FeedMode:
        if EVENTS_FEATURE in offered:
            return FeedMode.EVENTS
        if PULL_WAIT_FEATURE in offered:
            return FeedMode.LONG_POLL
        return FeedMode.POLL

    @staticmethod
    def _fallback(mode: FeedMode, offered: frozenset[str]) -> FeedMode:
        if mode is FeedMode.EVENTS and PULL_WAIT_FEATURE in offered:
            return FeedMode.LONG_POLL
        if mode is FeedMode.EVENTS:
            return FeedMode.POLL
        if mode is FeedMode.LONG_POLL:
            return FeedMode.POLL
        return mode

    def _backoff(self, attempt: int | None = None) -> float:
        """Full jitter over an exponential cap, never below the reconnect floor."""
        n = self._failures if attempt is None else attempt
        t = self.timing
        cap = min(t.reconnect_max_s, t.backoff_base_s * 2.0 ** min(n, 32))
        return t.reconnect_min_s + self._rng.uniform(0.0, max(0.0, cap - t.reconnect_min_s))

    def _pause(self, seconds: float | None) -> bool:
        """Wait `seconds` (None: until stopped); True when the feed was stopped."""
        return self._stop.wait(seconds)

    # -- the event stream -------------------------------------------------------------------

    def _stream_once(self, client: RelayClient) -> _Outcome:
        """One event stream from the device's cursor, until it ends (PROTOCOL §15)."""
        read = _StreamRead()
        started = time.monotonic()
        self._streams += 1
        try:
            opening = client.events(self._vault_id, cursor=self._cursor(), blobs=self._carry)
            with self._opened(opening) as stream:
                if self._read_stream(stream, read):
                    return _Outcome.FINAL
            problem = "the relay closed the event stream"
        except SseTooLargeError as exc:
            log.warning("dropped the event stream: %s", exc)
            problem = str(exc)
            read.items = 0  # a hostile stream counts as a failure, whatever it sent before
        except (SyncError, httpx.HTTPError) as exc:
            refused = self._stream_refused(exc)
            if refused is not None:
                return refused
            problem = one_line(f"{type(exc).__name__}: {exc}")[:200]
        if self._stop.is_set():
            return _Outcome.FINAL
        self.signals.set_link(FeedMode.EVENTS, False, problem)
        if read.items == 0:
            return _Outcome.FAILED
        return self._after_stream(read, started)

    def _read_stream(self, stream: EventStream, read: _StreamRead) -> bool:
        """Take a stream's items as they come; True when the feed is to end (revoked,
        stopped)."""
        big = MAX_BLOBS_EVENT_BYTES
        parser = SseParser(max_line=big, max_event=big) if self._carry else SseParser()
        last: int | None = None
        for chunk in stream.chunks():
            for item in parser.feed(chunk):
                read.items += 1
                if read.items == 1:
                    self.signals.set_link(FeedMode.EVENTS, True, None)
                if isinstance(item, SseRetry):
                    read.retry_ms = item.millis
                elif isinstance(item, SseEvent):
                    last = self._on_event(item, last)
                    if self.signals.revoked is not None:
                        return True
                # an SseComment (`: ping`): the stream is alive
            if self._stop.is_set():
                return True
        return False

    def _stream_refused(self, exc: SyncError | httpx.HTTPError) -> _Outcome | None:
        """The outcome of a stream the relay refused, or None for a failure to retry."""
        if isinstance(exc, DeviceRevokedError):
            self.signals.set_revoked(str(exc))
            return _Outcome.FINAL
        if not isinstance(exc, RelayError | FeedUnavailableError):
            return None
        self.signals.set_link(FeedMode.EVENTS, False, one_line(str(exc))[:200])
        if isinstance(exc, AuthError | ForbiddenError):
            return _Outcome.FAILED  # the loop's sync reports the key problem itself
        if isinstance(exc, FeedUnavailableError):
            return _Outcome.UNSUPPORTED
        if isinstance(exc, VaultRetiredError):  # PROTOCOL §19, past the grace period
            self.signals.set_retired()
            return _Outcome.FAILED
        if exc.status in (400, 404, 405, 406, 501):
            return _Outcome.UNSUPPORTED  # a relay or proxy without the route
        return _Outcome.FAILED

    def _after_stream(self, read: _StreamRead, started: float) -> _Outcome:
        """Wait before the next stream: PROTOCOL §15 `retry:` honoured within
        [reconnect_min_s, reconnect_max_s]; a stream that ends soon after it began waits
        out the backoff as well."""
        delay = (read.retry_ms or 0) / 1000.0
        delay = min(self.timing.reconnect_max_s, max(self.timing.reconnect_min_s, delay))
        if time.monotonic() - started < self.timing.reconnect_min_s * 2:
            self._failures += 1
            delay = max(delay, self._backoff())
        else:
            self._failures = 0
        delay += self._rng.uniform(0.0, delay / 2)
        return _Outcome.FINAL if self._pause(delay) else _Outcome.HEALTHY

    def _opened(self, manager: AbstractContextManager[EventStream]) -> _Held:
        return _Held(self, manager)

    def _on_event(self, event: SseEvent, last: int | None) -> int | None:
        if event.event == "revoked":
            self.signals.set_revoked(
                "the relay ended the live feed because this device (or its key) was revoked"
            )
            return last
        if event.event == "retired":
            # PROTOCOL §19: the vault was retired (its data names the successor: a hint the
            # loop's pull gets again from the pull's `retired`); the relay closes the stream
            self.signals.set_retired()
            return last
        if event.event != "change":
            return last  # unknown event types are ignored (additive)
        parsed = parse_change(event.data, last)
        if isinstance(parsed, str):
            self.signals.bad_hint(parsed)
            return last
        cursor, page = parsed
        if cursor > self._cursor():
            if page is not None:
                self.signals.offer_page(page)
            self.signals.offer_hint(cursor)
        return cursor

    # -- the long-poll ----------------------------------------------------------------------

    def _long_poll(self, client: RelayClient, *, until: float) -> _Outcome:
        """Long-polls (PROTOCOL §15) until one fails, or HEALTHY at `until` (monotonic: time
        to try the event stream again); each is a hint at most, never data: a page asked
        with limit 1 only says whether there is anything past the cursor."""
        early = 0
        while not self._stop.is_set():
            if time.monotonic() >= until:
                return _Outcome.HEALTHY
            began = time.monotonic()
            cursor = self._cursor()
            self._long_polls += 1
            try:
                page = client.pull(
                    self._vault_id, cursor=cursor, limit=1, wait=self.timing.long_poll_wait_s
                )
            except ResyncRequiredError:
                page = None  # news: the loop's pull resyncs (PROTOCOL §9)
            except (SyncError, httpx.HTTPError) as exc:
                return self._long_poll_refused(exc)
            self.signals.set_link(FeedMode.LONG_POLL, True, None)
            self._failures = 0
            if page is not None and not isinstance(page.retired, msgspec.UnsetType):
                self.signals.set_retired()  # PROTOCOL §19: the loop's pull says it again
            head = page.head if page is not None and isinstance(page.head, int) else None
            if page is None or bool(page.blobs) or (head is not None and head != cursor):
                early = 0
                if self._offer_news(head, cursor):
                    return _Outcome.FINAL
            elif time.monotonic() - began < min(1.0, self.timing.long_poll_wait_s / 2):
                early += 1  # an empty answer at once: this relay (or proxy) does not hold
                if early >= self.timing.early_answers_before_poll:
                    self.signals.set_link(
                        FeedMode.LONG_POLL, False, "the relay answers long-polls at once"
                    )
                    return _Outcome.UNSUPPORTED
            else:
                early = 0
            rest = self.timing.long_poll_min_cycle_s - (time.monotonic() - began)
            if rest > 0 and self._pause(rest):
                return _Outcome.FINAL
        return _Outcome.FINAL

    def _long_poll_refused(self, exc: SyncError | httpx.HTTPError) -> _Outcome:
        """The outcome of a long-poll that failed: revoked ends the feed, a relay without the
        long-poll is UNSUPPORTED, anything else FAILED."""
        if isinstance(exc, DeviceRevokedError):
            self.signals.set_revoked(str(exc))
            return _Outcome.FINAL
        self.signals.set_link(FeedMode.LONG_POLL, False, one_line(str(exc))[:200])
        if isinstance(exc, VaultRetiredError):  # PROTOCOL §19, past the grace period
            self.signals.set_retired()
            return _Outcome.FAILED
        if isinstance(exc, RelayError) and exc.status in (400, 404, 405):
            return _Outcome.UNSUPPORTED
        return _Outcome.FAILED

    def _offer_news(self, head: int | None, cursor: int) -> bool:
        """Hint the loop past `cursor` and wait for it to pull, or the same news would come
        back at once; True when the feed was stopped meanwhile."""
        hint = head if head is not None and head > cursor else cursor + 1
        self.signals.offer_hint(min(hint, MAX_CURSOR))
        return self.signals.consumed.wait(self.timing.hint_wait_s) and self._stop.is_set()


@dataclass
class _StreamRead:
    """What one event stream gave: its items, and the last `retry:` (PROTOCOL §15)."""

    items: int = 0
    retry_ms: int | None = None


class _Held:
    """Enter an event stream and keep it where `LiveFeed.stop` can abort it."""

    def __init__(self, feed: LiveFeed, manager: AbstractContextManager[EventStream]) -> None:
        self._feed, self._manager = feed, manager

    def __enter__(self) -> EventStream:
        stream = self._manager.__enter__()
        with self._feed._stream_lock:
            self._feed._stream = stream
            if self._feed._stop.is_set():
                stream.abort()
        return stream

    def __exit__(self, *exc: object) -> bool | None:
        with self._feed._stream_lock:
            self._feed._stream = None
        return self._manager.__exit__(*exc)  # type: ignore[arg-type]
