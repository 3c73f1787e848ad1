"""`pull?cursor=N&wait=S`: the long-poll fallback of the live change feed (PROTOCOL §15).

With nothing beyond the cursor, the answer waits on the vault's watch in the process's
change hub (relay.services.change_hub) until a commit passes the cursor or S seconds pass,
then it is an ordinary pull. No database connection is held while it waits, and it counts against
the same caps as the event streams (503 `busy` per process; per key, account and client
address, relay.domain.stream_holders: a held pull evicted for a newer waiter of its key or
account answers at once, as its wait had run out).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from engram_sync.relay.http.routes.feed_support import (
    Listener,
    device_revoked,
    give_back,
    take_place,
)
from engram_sync.relay.services.state import RelayState
from engram_sync.relay.store.sync import Page

MAX_WAIT_S: Final = 60


def _nothing_new(page: Page, cursor: int) -> bool:
    """An empty page at the vault's head: the one answer worth holding. A head below the
    cursor (a restored relay, §17) or a cursor moved past compacted tombstones is news."""
    return not page.blobs and not page.has_more and page.cursor == cursor == page.head


class _Hold:
    """The wait of one held pull, which an eviction cuts short."""

    __slots__ = ("evicted", "timeout")

    def __init__(self) -> None:
        self.evicted = False
        self.timeout: asyncio.Timeout | None = None  # set while it waits

    def evict(self) -> None:
        """Answer now (relay.domain.stream_holders: a newer waiter of its key or account)."""
        self.evicted = True
        if self.timeout is not None and not self.timeout.expired():
            self.timeout.reschedule(asyncio.get_running_loop().time())


async def held_pull(
    state: RelayState,
    listener: Listener,
    cursor: int,
    seconds: float,
    one_page: Callable[[], Awaitable[Page]],
    scope: MutableMapping[str, Any],
) -> Page:
    """`one_page()`, held (without a connection) while it has nothing beyond `cursor`."""
    hold = _Hold()
    # before the first page: no commit is missed
    watch, place = take_place(state, listener, scope, hold.evict)
    try:
        page = await one_page()
        if not _nothing_new(page, cursor):
            return page
        watch.observe(page.head)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        epoch = watch.epoch
        while watch.seq <= cursor:
            remaining = deadline - loop.time()
            if remaining <= 0 or hold.evicted:
                return page
            version = watch.version
            if watch.seq > cursor:
                break
            try:
                async with asyncio.timeout(remaining) as hold.timeout:
                    await watch.wait(version, remaining)
            except TimeoutError:
                pass
            finally:
                hold.timeout = None
            if watch.epoch != epoch:  # a revocation notice or a reconnect: re-check
                epoch = watch.epoch
                if not await listener.still_allowed(state):
                    raise device_revoked(listener)
        return await one_page()
    finally:
        give_back(state, listener, watch, place)
