"""A relay that says "resync" and then sends nothing must not make a device delete what it
holds (issue 13 item 2; PROTOCOL §17: missing is not deleted). Only a verified tombstone
deletes."""

from __future__ import annotations

from typing import Any

import pytest

from engram_sync.client._errors import RelayError
from tests.e2e.helpers import add, contents, delete
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import Answer, Exchange

RESYNC = {"error": "cursor is behind the compaction horizon", "code": "resync_required"}


def resync_then(empty: bool) -> Any:
    """409 for every pull with a cursor > 0; cursor 0 answers nothing (or the truth)."""

    def action(exchange: Exchange) -> Answer | None:
        if exchange.query.get("cursor") != "0":
            return Answer(409, RESYNC)
        if empty:
            return Answer(200, {"blobs": [], "has_more": False, "cursor": 0})
        return None

    return action


def test_resync_with_an_empty_page_deletes_nothing(scene: Scene) -> None:
    alpha = scene.device("alpha")
    ids = {add(alpha, f"memory {i}") for i in range(5)}
    alpha.sync()
    assert alpha.sync().cursor == 5  # pulled its own pushes back: the cursor is past them
    before = contents(alpha)
    assert set(before) == ids

    scene.proxy.on("GET", r"/pull$", resync_then(empty=True))
    report = alpha.sync()
    assert report.resynced
    assert contents(alpha) == before  # nothing deleted
    assert report.repushed == 5  # what the relay claimed to lack went back to it
    with alpha.open() as session:
        assert session.state.last_error is None
        assert not session.state.full_pull

    scene.proxy.honest()
    alpha.sync()
    assert contents(alpha) == before  # an honest full pull later restores nothing lost
    bravo = scene.device("bravo")
    bravo.sync()
    assert contents(bravo) == before


def test_honest_resync_repushes_nothing_and_keeps_everything(scene: Scene) -> None:
    alpha = scene.device("alpha")
    for i in range(5):
        add(alpha, f"memory {i}")
    alpha.sync()
    alpha.sync()
    before = contents(alpha)
    scene.proxy.on("GET", r"/pull$", resync_then(empty=False))
    report = alpha.sync()
    assert report.resynced
    assert report.repushed == 0
    assert report.pushed == 0
    assert contents(alpha) == before


def test_only_a_verified_tombstone_deletes_during_a_resync(scene: Scene) -> None:
    alpha, bravo = scene.device("alpha"), scene.device("bravo")
    keep, gone = add(alpha, "keep me"), add(alpha, "delete me")
    alpha.sync()
    bravo.sync()
    alpha.sync()
    delete(bravo, gone)
    bravo.sync()
    scene.proxy.on("GET", r"/pull$", resync_then(empty=False))
    report = alpha.sync()
    assert report.resynced
    assert contents(alpha) == {keep: "keep me"}  # the tombstone verified, so it deleted


def test_an_interrupted_full_pull_starts_again_and_finishes(scene: Scene) -> None:
    alpha = scene.device("alpha")
    for i in range(7):
        add(alpha, f"memory {i}")
    alpha.sync()
    alpha.sync()
    before = contents(alpha)

    calls = {"n": 0}

    def resync_then_fail(exchange: Exchange) -> Answer | None:
        calls["n"] += 1
        if exchange.query.get("cursor") != "0" and calls["n"] == 1:
            return Answer(409, RESYNC)
        if calls["n"] == 3:
            return Answer(400, {"error": "boom", "code": "bad_request"})  # mid re-pull
        return None

    scene.proxy.on("GET", r"/pull$", resync_then_fail)
    with pytest.raises(RelayError, match="boom"):  # the injected failure, mid re-pull
        alpha.sync(pull_page=3)
    with alpha.open() as session:
        assert session.state.full_pull  # remembered: the next sync starts from 0 again
    scene.proxy.honest()
    report = alpha.sync(pull_page=3)
    assert report.resynced
    assert report.pulled == 7  # the whole vault again, from cursor 0
    assert contents(alpha) == before
    with alpha.open() as session:
        assert not session.state.full_pull
