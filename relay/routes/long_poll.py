"""`pull?cursor=N&wait=S`: the long-poll fallback of the live change feed (PROTOCOL §15).

With nothing beyond the cursor, the answer waits on the vault's watch in the process's
change hub (relay.feed) until a commit passes the cursor or S seconds pass, then it is
an ordinary pull. No database connection is held while it waits, and it counts against
the same cap as the event streams (503 `busy`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

from engram_sync.relay.routes.feed_support import Listener, device_revoked, join
from engram_sync.relay.state import RelayState
from engram_sync.relay.store.sync import Page

MAX_WAIT_S: Final = 60


def _nothing_new(page: Page, cursor: int) -> bool:
    """An empty page at the vault's head: the one answer worth holding. A head below the
    cursor (a restored relay, §17) or a cursor moved past compacted tombstones is news."""
    return not page.blobs and not page.has_more and page.cursor == cursor == page.head


async def held_pull(
    state: RelayState,
    listener: Listener,
    cursor: int,
    seconds: float,
    one_page: Callable[[], Awaitable[Page]],
) -> Page:
    """`one_page()`, held (without a connection) while it has nothing beyond `cursor`."""
    hub = state.require_hub()
    watch = join(hub, listener.vault_id)  # before the first page: no commit is missed
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
            if remaining <= 0:
                return page
            version = watch.version
            if watch.seq > cursor:
                break
            await watch.wait(version, remaining)
            if watch.epoch != epoch:  # a revocation notice or a reconnect: re-check
                epoch = watch.epoch
                if not await listener.still_allowed(state):
                    raise device_revoked(listener)
        return await one_page()
    finally:
        hub.leave(listener.vault_id, watch)
