"""Blobs carried by the change event (docs/live-feed.md "Blobs in the event") on the
device, through the real relay: a watching device applies them without pulling, and a
page from the feed is never trusted more than a pull page. It is checked the same way.
A page from another generation, or one that fails the checks, is dropped: the device
pulls over HTTP instead. A page that leaves a blob out is found out by the digest check
at the end of the same sync, and that check fetches the blob."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from engram_sync.client._sync.engine import SyncReport
from engram_sync.client._sync.feed import parse_change
from engram_sync.shared_format.wire import PullResponse
from tests.e2e.conftest import VAULT_ID, DeviceHandle
from tests.e2e.helpers import add, contents
from tests.e2e.live_support import Watcher, wait_for


def cursor_of(device: DeviceHandle) -> int:
    with device.open() as session:
        return session.state.cursor


def sync_with(device: DeviceHandle, pages: dict[int, PullResponse], **options: int) -> SyncReport:
    with device.open() as session, session.relay(max_retries=1, backoff_base=0) as client:
        return session.syncer(client, **options).sync(feed_pages=pages)


def honest_page(device: DeviceHandle, cursor: int) -> PullResponse:
    with device.relay_client() as client:
        page = client.pull(VAULT_ID, cursor=cursor, limit=1000)
    assert len(page.blobs) == 2, page
    return page


def two_new_memories(alpha: DeviceHandle, bravo: DeviceHandle) -> tuple[int, list[str]]:
    """Both devices synced, then two memories pushed by bravo; alpha's cursor before."""
    alpha.sync()
    bravo.sync()
    before = cursor_of(alpha)
    memories = [add(bravo, "first of two"), add(bravo, "second of two")]
    bravo.sync()
    return before, memories


def test_a_watching_device_applies_the_blobs_the_event_carried(
    devices: list[DeviceHandle],
) -> None:
    alpha, bravo, _ = devices
    bravo.sync()
    watcher = Watcher(alpha.path).start()
    try:
        wait_for(lambda: watcher.mode() == "events", "the event stream")
        memory = add(bravo, "carried in the change event")
        bravo.sync()
        wait_for(lambda: watcher.applied >= 1, "the memory on the watching device")
    finally:
        watcher.stop()
    assert watcher.error is None, watcher.error
    applied = [r for r in watcher.reports if r.applied]
    assert applied[-1].feed_pages == 1  # the page came with the event: no pull for it
    assert all(r.feed_pages == 0 for r in watcher.reports if not r.applied)
    alpha.restart()
    assert contents(alpha)[memory] == "carried in the change event"


def test_an_honest_page_is_applied_in_place_of_the_pull(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    before, memories = two_new_memories(alpha, bravo)
    page = honest_page(alpha, before)
    report = sync_with(alpha, {before: replace(page, has_more=False)})
    assert report.feed_pages == 1
    assert report.applied == 2
    assert set(memories) <= set(contents(alpha))
    # and a page that follows no cursor the device reaches is not used at all
    report = sync_with(alpha, {before: page})
    assert report.feed_pages == 0


def forge(page: PullResponse, how: str) -> PullResponse:
    first, second = page.blobs
    assert isinstance(page.cursor, int)
    if how == "another generation":
        return replace(page, generation="another-generation")
    if how == "sequence numbers going back":
        return replace(page, blobs=[second, first])
    assert how == "a cursor past its last blob"
    return replace(page, cursor=page.cursor + 999, head=page.cursor + 999)


def test_an_honest_page_larger_than_the_devices_pull_page_is_applied(
    devices: list[DeviceHandle],
) -> None:
    """The device's page size bounds what it asks for over HTTP; a feed page was not asked
    for with it (its bound is a pull page's, MAX_PULL_LIMIT)."""
    alpha, bravo, _ = devices
    before, memories = two_new_memories(alpha, bravo)
    page = honest_page(alpha, before)
    report = sync_with(alpha, {before: replace(page, has_more=False)}, pull_page=1)
    assert report.feed_pages == 1
    assert report.applied == 2
    assert set(memories) <= set(contents(alpha))


@pytest.mark.parametrize(
    "how", ["another generation", "sequence numbers going back", "a cursor past its last blob"]
)
def test_a_page_of_another_generation_or_failing_the_checks_is_dropped(
    devices: list[DeviceHandle], how: str
) -> None:
    alpha, bravo, _ = devices
    before, memories = two_new_memories(alpha, bravo)
    page = honest_page(alpha, before)
    report = sync_with(alpha, {before: forge(page, how)})
    assert report.feed_pages == 0
    assert report.applied == 2  # the HTTP pull brought them instead
    assert set(memories) <= set(contents(alpha))
    assert cursor_of(alpha) == page.cursor


def test_a_page_that_leaves_a_blob_out_is_repaired_by_the_digest_check(
    devices: list[DeviceHandle],
) -> None:
    alpha, bravo, _ = devices
    before, memories = two_new_memories(alpha, bravo)
    page = honest_page(alpha, before)
    # The relay's sequence numbers may have gaps (a replaced blob leaves one), so this
    # page passes the checks of a pull page: the cursor moves past the blob left out.
    lying = replace(page, blobs=page.blobs[1:])
    report = sync_with(alpha, {before: lying})
    assert report.feed_pages == 1
    assert report.digest is not None
    assert report.digest.fetched == 1  # the one left out, found and fetched
    assert report.digest.matched
    assert report.applied == 2
    assert set(memories) <= set(contents(alpha))


def test_the_change_event_is_read_as_a_page_only_when_it_can_be_one() -> None:
    blob = (
        '{"vault_id":"v","memory_id":"m","device_id":"d","vector_clock":1,"ciphertext":"",'
        '"hmac":"","created_at":"2026-01-01T00:00:00Z","deleted":false,"seq":5}'
    )
    cursor, page = parse_change(
        '{"cursor":5,"after":4,"generation":"g","blobs":[' + blob + "]}", None
    )  # type: ignore[misc]
    assert cursor == 5
    assert page is not None
    assert (page.after, page.cursor, page.page.generation) == (4, 5, "g")
    assert [b.seq for b in page.page.blobs] == [5]
    assert parse_change('{"cursor":5}', None) == (5, None)  # the plain hint
    assert parse_change('{"cursor":5,"after":5,"blobs":[' + blob + "]}", None) == (5, None)
    assert parse_change('{"cursor":5,"after":4,"blobs":[]}', None) == (5, None)
    assert parse_change('{"cursor":5,"blobs":[' + blob + "]}", None) == (5, None)
    assert isinstance(parse_change('{"cursor":5,"after":4,"blobs":[{"x":1}]}', None), str)
    assert isinstance(parse_change('{"cursor":3}', 4), str)  # back on the stream
