"""Blobs carried by the change event (docs/live-feed.md "Blobs in the event") on the
device, through the real relay: a watching device applies them without pulling, and a
page from the feed is never trusted more than a pull page. It is checked the same way.
A page from another generation, or one that fails the checks, is dropped: the device
pulls over HTTP instead. A page that leaves a sequence number out (a blob left out, a
`seq` far ahead) is dropped too: it could skip data or move the cursor past the relay's
sequence and fake a restore (issue 31, client._sync.feed_page_bound)."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from engram_sync.client._sync.feed_page_bound import feed_page_gap
from engram_sync.client._sync.live_feed import parse_change
from engram_sync.client._sync.reports import SyncReport
from engram_sync.shared_format.wire import PullResponse, SyncBlob
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
    assert (report.feed_pages, report.feed_dropped) == (1, 0)
    assert report.applied == 2
    assert set(memories) <= set(contents(alpha))
    assert not sync_with(alpha, {}).restored  # the cursor it left is the relay's
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
    if how == "a cursor past its last blob":
        return replace(page, cursor=page.cursor + 999, head=page.cursor + 999)
    if how == "a blob left out":  # the hole a replaced blob leaves, or a lie
        return replace(page, blobs=[second])
    assert how == "a last blob's sequence far ahead"  # issue 31 (12b): `seq` has no HMAC
    far = 10**9
    return replace(page, blobs=[first, replace(second, seq=far)], cursor=far, head=far)


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
    "how",
    [
        "another generation",
        "sequence numbers going back",
        "a cursor past its last blob",
        "a blob left out",
        "a last blob's sequence far ahead",
    ],
)
def test_a_page_of_another_generation_or_failing_the_checks_is_dropped(
    devices: list[DeviceHandle], how: str
) -> None:
    """Each lie is dropped (counted in `feed_dropped`, logged) and the HTTP pull brings the
    blobs; no cursor past what the relay holds, so the next sync finds no false restore
    (PROTOCOL §17). A page with a hole is dropped too: the feed page has no `head` of its
    own, so it moves the cursor only over the blobs it carries (client._sync.feed_page_bound);
    an honest page with a hole (a replaced blob) costs a pull."""
    alpha, bravo, _ = devices
    before, memories = two_new_memories(alpha, bravo)
    page = honest_page(alpha, before)
    report = sync_with(alpha, {before: forge(page, how)})
    assert (report.feed_pages, report.feed_dropped) == (0, 1)
    assert report.applied == 2  # the HTTP pull brought them instead
    assert set(memories) <= set(contents(alpha))
    assert cursor_of(alpha) == page.cursor
    after = sync_with(alpha, {})
    assert (after.restored, after.resynced) == (False, False)
    assert after.pulled == 0


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


def test_a_feed_page_accounts_for_every_sequence_number_it_moves_over() -> None:
    """client._sync.feed_page_bound, without I/O: `after + 1`, …, `cursor`, one each."""
    blob = SyncBlob("v", "m", "d", 1, "", "", "2026-01-01T00:00:00Z", False)

    def page(seqs: list[int | None], cursor: int) -> PullResponse:
        blobs = [blob if s is None else replace(blob, seq=s) for s in seqs]
        return PullResponse(blobs=blobs, has_more=False, cursor=cursor, head=cursor)

    assert feed_page_gap(page([5, 6, 7], 7), 4) is None
    assert feed_page_gap(page([5, 7], 7), 4) is not None  # 6 left out
    assert feed_page_gap(page([6, 7], 7), 4) is not None  # 5 left out
    assert feed_page_gap(page([5, 10**9], 10**9), 4) is not None  # a `seq` far ahead
    assert feed_page_gap(page([5, 6], 9), 4) is not None  # a cursor past its last blob
    assert feed_page_gap(page([5, None], 6), 4) is not None  # a blob without its `seq`
