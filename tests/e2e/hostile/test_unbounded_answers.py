"""Answers too large or too slow (issue 13 item 7): the client caps what it reads and how
long an answer may take, fails cleanly past either, and applies nothing of it."""

from __future__ import annotations

import pytest

from engram_sync.client._errors import AnswerTooLargeError, RelayUnavailableError
from engram_sync.client._http.relay_client import (
    MAX_ANSWER_BYTES,
    PULL_PAGE_BUDGET_BYTES,
    RelayClient,
)
from tests.e2e.helpers import add, contents
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import Answer
from tests.relay.conftest import ADMIN_KEY

MIB = 1024 * 1024


def test_a_huge_declared_pull_answer_is_dropped(scene: Scene) -> None:
    alpha = scene.device("alpha")
    add(alpha, "kept")
    alpha.sync()
    before = contents(alpha)
    huge = b'{"blobs":[' + b" " * (PULL_PAGE_BUDGET_BYTES + MIB) + b'],"has_more":false}'
    rule = scene.proxy.on("GET", r"/pull$", lambda e: Answer(200, huge), forward=False)
    with pytest.raises(AnswerTooLargeError):
        alpha.sync()
    assert rule.hits == 10  # limits 1000, 500, 250, ..., 3, 1: then it gives up
    assert contents(alpha) == before


def test_a_huge_chunked_pull_answer_is_cut_off(scene: Scene) -> None:
    alpha = scene.device("alpha")
    add(alpha, "kept")
    alpha.sync()
    before = contents(alpha)
    rule = scene.proxy.on(
        "GET", r"/pull$", lambda e: Answer(200, b" " * 65536, chunks=64), forward=False
    )  # 4 MiB without a Content-Length, against a budget of 1 MiB
    with pytest.raises(AnswerTooLargeError):
        alpha.sync(page_budget=MIB)
    assert rule.hits == 10
    assert contents(alpha) == before
    with alpha.open() as session:
        assert "more than" in (session.state.last_error or "")


def test_an_honest_page_of_large_memories_is_fetched_in_smaller_pages(scene: Scene) -> None:
    """The honest counterpart: a budget smaller than a full page makes the device ask
    for fewer blobs, never fail."""
    alpha, bravo = scene.device("alpha"), scene.device("bravo")
    for i in range(10):
        add(alpha, f"{i} " + "x" * 20_000)
    alpha.sync()
    report = bravo.sync(page_budget=100_000)
    assert report.applied == 10
    assert contents(bravo) == contents(alpha)
    limits = {e.query["limit"] for e in scene.proxy.requests("GET", r"/pull$")}
    assert len(limits) > 1  # it did ask for fewer


def test_a_huge_push_answer_is_dropped(scene: Scene) -> None:
    alpha = scene.device("alpha")
    add(alpha, "pushed")
    scene.proxy.on("POST", r"/push$", lambda e: Answer(200, b" " * (MAX_ANSWER_BYTES + 1)))
    with pytest.raises(AnswerTooLargeError):
        alpha.sync()
    scene.proxy.honest()
    report = alpha.sync()  # the retry finds its own push on the relay or pushes again
    assert report.pushed + report.stale + report.rejected >= 1
    bravo = scene.device("bravo")
    bravo.sync()
    assert contents(bravo) == contents(alpha)


def test_an_answer_trickling_past_the_deadline_fails(scene: Scene) -> None:
    scene.proxy.on(
        "GET", r"/v1/info$", lambda e: Answer(200, b" ", chunks=30, chunk_delay=0.2)
    )  # each read is quick, the whole answer takes 6 s; deadline 4 x 0.5 s
    with (
        RelayClient(scene.proxy.url, ADMIN_KEY, timeout=0.5, max_retries=0) as relay,
        pytest.raises(RelayUnavailableError, match="longer than"),
    ):
        relay.info()
    scene.proxy.honest()
    with RelayClient(scene.proxy.url, ADMIN_KEY, timeout=0.5, max_retries=0) as relay:
        assert relay.info().max_pull_limit >= 1  # the honest counterpart, same timeout
