"""How far a page from the live feed may move the cursor (docs/live-feed.md "Blobs in the
event"; issue 31 finding 12b).

A pull page's cursor is bounded by the vault's sequence the relay sends with it (`head`,
PROTOCOL §9; `engine.check_page`). A page the live feed carried has no such number of its
own: the change's `cursor` is both its cursor and its head. Without another bound, one
blob with a forged `seq` (not covered by the HMAC of §3) could move the device's cursor to
any value: the blobs in between are skipped, and the next HTTP pull, which finds the
vault's sequence below that cursor, takes the relay for restored (§17) and pulls the whole
vault again.

So a feed page must account for every sequence number it moves over: its blobs carry
exactly `after + 1, …, cursor`, one each. A feed page can then move the cursor only as far
as the blobs it hands over, like a pull page that skips nothing. An honest relay's page has
a hole only when a later push of the same push group replaced a blob (relay.store.push,
`committed_changes`): such a page is dropped as well, and the device pulls over HTTP, which
costs one pull (the feed can spare a pull, never fail one).
"""

from __future__ import annotations

from engram_sync.shared_format.wire import PullResponse


def feed_page_gap(page: PullResponse, after: int) -> str | None:
    """Why the feed page following cursor `after` skips a sequence number (None: it does
    not): every blob carries its `seq`, and they are `after + 1`, …, the page's cursor."""
    expected = after
    for blob in page.blobs:
        expected += 1
        if blob.seq != expected:
            return f"blob sequence {blob.seq} where {expected} was due (after cursor {after})"
    if page.cursor != expected:
        return f"cursor {page.cursor} past its last blob's sequence {expected}"
    return None
