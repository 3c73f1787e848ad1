"""A lying live feed's page, through the real watch loop (issue 31 finding 12b;
client._sync.feed_page_bound, docs/live-feed.md "Blobs in the event").

A change event may carry the blobs of a small commit; the device applies them in place of
a pull. Their `seq` is not covered by the HMAC (PROTOCOL §3), and a feed page has no
`head` of its own, so a relay could hand over a real blob with a `seq` far ahead: the
device's cursor would jump past the relay's sequence, and its next pull would take the
relay for restored (§17) and pull the whole vault again. The page is refused (counted,
logged), the device pulls over HTTP instead, and the next sync finds nothing restored.
The honest page beside it is applied in place of the pull.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.e2e.helpers import add, contents
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import event_stream, rewrite_json
from tests.e2e.hostile.test_live_feed import EVENTS, RETRY, offer
from tests.e2e.live_support import Watcher, wait_for
from tests.relay.conftest import ADMIN_KEY

FAR = 10**9


@pytest.mark.parametrize("lie", [False, True])
def test_a_feed_page_with_a_seq_far_ahead_is_refused_and_fakes_no_restore(
    scene: Scene, lie: bool
) -> None:
    alpha, bravo = scene.device("alpha"), scene.device("bravo", through_proxy=False)
    alpha.sync()
    with alpha.open() as session:
        before, generation = session.state.cursor, session.state.generation
    memory = add(bravo, "carried by the change event")
    bravo.sync()
    with httpx.Client(base_url=scene.relay.url, timeout=30) as client:
        page = client.get(
            f"/v1/vaults/{scene.vault_id}/pull",
            params={"cursor": before, "limit": 10},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ).json()
    (blob,) = page["blobs"]
    real = blob["seq"]
    cursor = FAR if lie else real
    carried = {"cursor": cursor, "after": before, "generation": generation,
               "blobs": [dict(blob, seq=cursor)]}  # fmt: skip
    change = b"event: change\ndata: " + json.dumps(carried).encode() + b"\n\n"

    offer(scene, "events", "events-blobs")

    def nothing_new(answer: dict[str, Any]) -> None:  # the watch's first pull sees no news
        answer.update(blobs=[], has_more=False, cursor=before, head=before)

    scene.proxy.on("GET", r"/pull$", rewrite_json(nothing_new), times=1)
    scene.proxy.on("GET", EVENTS, lambda e: event_stream(RETRY, (2.0, change), hold=60),
                   forward=False, times=1)  # fmt: skip
    alpha.restart()
    watch = Watcher(alpha.path).start()
    try:
        wait_for(lambda: watch.applied >= 1 or not watch.running, "the memory, by the feed")
    finally:
        watch.stop()
    assert watch.error is None, watch.error
    used = sum(r.feed_pages for r in watch.reports)
    dropped = sum(r.feed_dropped for r in watch.reports)
    assert (used, dropped) == ((0, 1) if lie else (1, 0))
    assert memory in contents(alpha)  # the lie: brought by the HTTP pull instead

    report = alpha.sync()  # the next sync: the cursor is the relay's, nothing was restored
    assert (report.restored, report.resynced, report.pulled) == (False, False, 0)
    with alpha.open() as session:
        assert session.state.cursor == real
