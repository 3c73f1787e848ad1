"""Cursors and pages from a lying relay (issue 13 items 5 and 6): a cursor that goes back,
passes 2^63-1 or the vault's sequence, or jumps without blobs is refused and reported;
a relay that keeps answering `has_more` without progress stops the sync with a clear
error instead of making it pull forever."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from engram_sync.client._errors import ProtocolError, RelayMisbehavedError
from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add, contents
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import Answer, Exchange, rewrite_json


def _ready(scene: Scene) -> tuple[DeviceHandle, DeviceHandle]:
    """alpha has pulled to cursor 3; bravo then adds 2 memories the lie is about."""
    alpha, bravo = scene.device("alpha"), scene.device("bravo")
    for i in range(3):
        add(alpha, f"alpha {i}")
    alpha.sync()
    assert alpha.sync().cursor == 3
    for i in range(2):
        add(bravo, f"bravo {i}")
    bravo.sync()
    return alpha, bravo


def _set(**fields: Any) -> Callable[[Any], None]:
    def change(value: dict[str, Any]) -> None:
        value.update(fields)

    return change


def _strip_seq(value: dict[str, Any]) -> None:
    for blob in value["blobs"]:
        blob.pop("seq", None)


LIES: dict[str, Callable[[Any], Any]] = {
    "cursor above 2^63-1": _set(cursor=2**63),
    "cursor 2^70": _set(cursor=2**70),
    "cursor back": _set(cursor=1),
    "cursor past the vault's sequence": _set(cursor=50),
    # A jump to exactly the head on a last page is what an honest relay answers above
    # compacted tombstones (issue 14 item 9), accepted; a jump anywhere else is not.
    "jump ahead without blobs": _set(blobs=[], cursor=4, has_more=False),
    "jump to the head without blobs, announcing more": _set(blobs=[], cursor=5, has_more=True),
    "cursor beyond the last blob": lambda v: v.update(cursor=v["cursor"] + 10, head=99),
    "blob sequence going back": lambda v: [b.update(seq=2) for b in v["blobs"]],
}


@pytest.mark.parametrize("lie", list(LIES))
def test_a_lying_cursor_is_refused_and_reported(scene: Scene, lie: str) -> None:
    alpha, _ = _ready(scene)
    before = contents(alpha)
    scene.proxy.on("GET", r"/pull$", rewrite_json(LIES[lie]))
    with pytest.raises(ProtocolError):
        alpha.sync()
    assert contents(alpha) == before  # nothing of the page applied
    with alpha.open() as session:
        assert session.state.cursor == 3  # the lie was not stored
        assert session.state.last_error  # `status` shows it
    scene.proxy.honest()  # the honest counterpart: the same sync goes through
    report = alpha.sync()
    assert report.applied == 2
    assert report.cursor == 5
    with alpha.open() as session:
        assert session.state.last_error is None


def test_a_jump_to_the_head_on_a_last_page_is_the_accepted_trade_off(scene: Scene) -> None:
    """PROTOCOL §9, §12 (issue 14 item 9): a last page may end at exactly `head`, past its
    last blob or with none, since that is the honest answer above compacted tombstones.
    A relay lying that way can only make the device skip to the head (what a forged `seq`
    on one real blob already could); the cursor never passes the head. Since PROTOCOL §18
    the digest check that ends the sync finds the two memories the page skipped and
    fetches them (docs/digest.md): the lie no longer loses them."""
    alpha, _ = _ready(scene)
    before = contents(alpha)
    scene.proxy.on("GET", r"/pull$", rewrite_json(_set(blobs=[], cursor=5, has_more=False)))
    report = alpha.sync()
    assert report.cursor == 5
    assert report.digest is not None
    assert (report.digest.device_lacks, report.digest.fetched) == (2, 2)
    assert report.digest.matched
    assert report.applied == 2
    assert set(before) < set(contents(alpha))  # the two skipped memories arrived after all
    assert len(contents(alpha)) == len(before) + 2


def test_a_page_without_sequence_numbers_must_still_move_the_cursor(scene: Scene) -> None:
    alpha, _ = _ready(scene)

    def same_cursor(value: dict[str, Any]) -> None:
        _strip_seq(value)
        value.update(cursor=3, has_more=True)

    scene.proxy.on("GET", r"/pull$", rewrite_json(same_cursor))
    with pytest.raises(RelayMisbehavedError, match="no progress"):
        alpha.sync()
    scene.proxy.honest()
    _strip_seq_rule = scene.proxy.on("GET", r"/pull$", rewrite_json(_strip_seq))
    assert alpha.sync().applied == 2  # without seq, an honest page is still accepted
    assert _strip_seq_rule.hits >= 1


def test_endless_has_more_stops_at_once(scene: Scene) -> None:
    alpha, _ = _ready(scene)

    def endless(exchange: Exchange) -> Answer:
        value = exchange.json()
        value["has_more"] = True
        value["cursor"] = int(exchange.query["cursor"])  # the same cursor, again and again
        return Answer(200, value)

    rule = scene.proxy.on("GET", r"/pull$", endless)
    with pytest.raises(RelayMisbehavedError):
        alpha.sync()
    assert rule.hits == 1  # refused at the first page without progress (was 906 in 59 s)


def test_endless_empty_pages_stop_at_once(scene: Scene) -> None:
    alpha, _ = _ready(scene)
    rule = scene.proxy.on(
        "GET",
        r"/pull$",
        lambda e: Answer(200, {"blobs": [], "has_more": True, "cursor": int(e.query["cursor"])}),
        forward=False,
    )
    with pytest.raises(RelayMisbehavedError, match="no progress"):
        alpha.sync()
    assert rule.hits == 1
