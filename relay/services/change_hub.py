"""The change hub of one relay process (PROTOCOL §15): per-vault wake-ups for streams.

Every event stream and long-poll of a vault waits on that vault's `VaultWatch`; the hub
keeps a watch only while someone waits on it. A watch holds the highest sequence this
process has heard of for its vault (from its own pushes, from the NOTIFYs other
processes send, relay.services.feed_listener, and from the database read a waiter starts with)
and an `epoch` that moves when every waiter should re-check who it is serving (a device
of the vault was revoked, or the LISTEN connection was lost and is back: a notification
may have been missed). Waking is one `asyncio.Event` per vault, swapped on each wake, for
waiters that `wait` (the long-poll), plus the wakers event streams register while they
sit idle (`add_waker`): an idle waiter costs a coroutine and nothing else (no timer
beyond its ping, no query).

A watch with `blobs=1` streams (`carriers`) also keeps the last few small commits it
heard of with their blobs (docs/live-feed.md "Blobs in the event"), so those streams can
send them in the event: `blobs_between(after, seq)` is their JSON when the commits kept
lead from `after` to `seq` without a gap, else None (the device pulls, as for a hint).

Nothing here touches the database or HTTP: the cursor in PostgreSQL stays the truth, a
watch only says when it is worth looking again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final

from engram_sync.relay.store.feed_notify import Commit

log = logging.getLogger(__name__)

# How much of the recent commits a watch keeps for its `blobs=1` streams: a stream is
# woken at once, so it is rarely more than one commit behind; one further behind pulls.
KEPT_COMMITS: Final = 4
KEPT_BYTES: Final = 32 * 1024


class VaultWatch:
    """What the waiters of one vault share."""

    __slots__ = (
        "_commits", "_event", "_wakers", "carriers", "epoch", "seq", "users", "version",
    )  # fmt: skip

    def __init__(self) -> None:
        self.seq = 0  # the highest sequence heard of (0 = nothing yet)
        self.epoch = 0  # moves when waiters must re-check their key or device
        self.version = 0  # moves on every wake
        self.users = 0
        self.carriers = 0  # the `blobs=1` streams among the users
        self._event = asyncio.Event()
        self._wakers: set[Callable[[], None]] = set()
        self._commits: dict[int, Commit] = {}  # after -> commit, oldest first

    def remember(self, commit: Commit) -> None:
        """Keep a small commit's blobs for the `blobs=1` streams (none: nothing kept)."""
        if self.carriers <= 0 or commit.blobs is None:
            return
        kept = self._commits
        kept[commit.after] = commit
        while (
            len(kept) > KEPT_COMMITS or sum(len(c.blobs or b"") for c in kept.values()) > KEPT_BYTES
        ):
            del kept[next(iter(kept))]

    def blobs_between(self, after: int, seq: int) -> bytes | None:
        """The JSON array of every blob committed in (`after`, `seq`], from the commits
        kept, or None when they do not cover that range exactly."""
        parts: list[bytes] = []
        at = after
        while at < seq:
            commit = self._commits.get(at)
            if commit is None or commit.blobs is None or commit.seq > seq:
                return None
            parts.append(commit.blobs)
            at = commit.seq
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        return b"[" + b",".join(p[1:-1] for p in parts if len(p) > 2) + b"]"

    def observe(self, seq: int) -> bool:
        """Record `seq`; wake the waiters if it passes what was known. True when it did."""
        if seq <= self.seq:
            return False
        self.seq = seq
        self._wake()
        return True

    def recheck(self) -> None:
        """Wake the waiters to re-check their key and device (a revocation, a reconnect)."""
        self.epoch += 1
        self._wake()

    def _wake(self) -> None:
        self.version += 1
        event, self._event = self._event, asyncio.Event()
        event.set()
        for waker in tuple(self._wakers):
            try:
                waker()
            except Exception:  # one broken waiter must not stop a push or the listener
                log.exception("a change feed waker failed")

    def add_waker(self, waker: Callable[[], None]) -> None:
        """Call `waker` (synchronously, in the event loop) on every wake until it is
        discarded; it must not raise. An event stream's way to be woken without a task or
        a future of its own (relay.http.routes.events)."""
        self._wakers.add(waker)

    def discard_waker(self, waker: Callable[[], None]) -> None:
        """Stop calling `waker` (no error when it was not added)."""
        self._wakers.discard(waker)

    async def wait(self, version: int, timeout: float) -> bool:
        """Wait until the watch moves past `version` or `timeout` seconds pass; True if it
        moved. Take `version` before looking at `seq`/`epoch`, so no wake is lost between."""
        if self.version != version:
            return True
        event = self._event
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()
        return self.version != version


class HubFullError(Exception):
    """The process holds as many streams and long-polls as it may (`max_waiters`)."""


class ChangeHub:
    """The watches of one process, plus the cap on how many waiters it holds."""

    def __init__(self, *, max_waiters: int) -> None:
        if max_waiters < 1:
            raise ValueError("max_waiters must be >= 1")
        self.max_waiters = max_waiters
        self.waiters = 0
        self._watches: dict[str, VaultWatch] = {}

    def join(self, vault_id: str) -> VaultWatch:
        """Take a place among the waiters of `vault_id` (`HubFullError` when the process is full);
        give it back with `leave` exactly once."""
        if self.waiters >= self.max_waiters:
            raise HubFullError
        watch = self._watches.get(vault_id)
        if watch is None:
            watch = self._watches[vault_id] = VaultWatch()
        watch.users += 1
        self.waiters += 1
        return watch

    def leave(self, vault_id: str, watch: VaultWatch) -> None:
        """Give back a place `join` gave; the watch goes when its last waiter left."""
        self.waiters -= 1
        watch.users -= 1
        if watch.users == 0 and self._watches.get(vault_id) is watch:
            del self._watches[vault_id]

    @contextlib.contextmanager
    def watch(self, vault_id: str) -> Iterator[VaultWatch]:
        """`join` for the length of a block."""
        watch = self.join(vault_id)
        try:
            yield watch
        finally:
            self.leave(vault_id, watch)

    def watched(self) -> list[str]:
        """The vaults someone waits on now."""
        return list(self._watches)

    def publish(self, vault_id: str, seq: int) -> None:
        """A commit reached `seq` in `vault_id` (dropped when nobody waits on the vault)."""
        watch = self._watches.get(vault_id)
        if watch is not None:
            watch.observe(seq)

    def publish_commits(self, commits: Iterable[Commit]) -> None:
        """`publish` of commits, their blobs kept first for the `blobs=1` streams."""
        for commit in commits:
            watch = self._watches.get(commit.vault_id)
            if watch is not None:
                watch.remember(commit)
                watch.observe(commit.seq)

    def recheck(self, vault_id: str) -> None:
        """A device of `vault_id` was revoked: its waiters re-check."""
        watch = self._watches.get(vault_id)
        if watch is not None:
            watch.recheck()

    def recheck_all(self, heads: Mapping[str, int]) -> None:
        """After the LISTEN connection came back: the heads read since, then every waiter
        re-checks (a notification, of a commit or of a revocation, may have been lost)."""
        for vault_id, watch in list(self._watches.items()):
            seq = heads.get(vault_id)
            if seq is not None:
                watch.seq = max(watch.seq, seq)
            watch.recheck()
