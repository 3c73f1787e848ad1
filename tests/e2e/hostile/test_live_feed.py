"""The live change feed from a lying relay (PROTOCOL §15; issue 15): every line of the
event stream is hostile input. A flood of hints, a stream that closes at once, hints that
are not integers or go back, an endless line, a stream a proxy will not pass: the device
neither spins nor trusts a hint for data (it pulls with its own cursor), and falls back to
the long-poll, then to its timer. A push answer that lies about the device's own commit is
caught by the next pull (client._sync.own_pushes)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from engram_sync.client._errors import DeviceRevokedError
from engram_sync.client._flows.live import LiveTiming
from engram_sync.client._session import VaultSession
from tests.e2e.conftest import PASSPHRASE
from tests.e2e.helpers import add, contents
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import Answer, Exchange, event_stream, rewrite_json
from tests.e2e.live_support import Watcher, wait_for

EVENTS = r"/events$"
RETRY = b"retry: 2000\n\n"


def offer(scene: Scene, *features: str) -> None:
    """The relay's /v1/info, as the device sees it, lists exactly these feed features (and
    no anti-entropy digest, PROTOCOL §18, which would repair what these tests look at)."""

    def change(info: dict[str, Any]) -> None:
        feed = ("events", "events-blobs", "pull-wait", "digest")
        kept = [f for f in info["features"] if f not in feed]
        info["features"] = kept + list(features)

    scene.proxy.on("GET", r"^/v1/info$", rewrite_json(change))


def change(cursor: object) -> bytes:
    return b"event: change\ndata: " + json.dumps({"cursor": cursor}).encode() + b"\n\n"


def pulls(scene: Scene) -> list[Exchange]:
    """The device's ordinary pulls (not long-polls)."""
    return [e for e in scene.proxy.requests("GET", r"/pull$") if "wait" not in e.query]


def streams(scene: Scene) -> int:
    return len(scene.proxy.requests("GET", EVENTS))


def test_a_hint_makes_the_device_pull_with_its_own_cursor_never_the_hints(scene: Scene) -> None:
    """The honest shape of a hint triggers a pull; the pull asks with the device's cursor,
    and a hint far ahead of the vault moves nothing."""
    watcher_dev, writer = scene.device("watcher"), scene.device("writer", through_proxy=False)
    memory = add(writer, "pushed past the proxy")
    writer.sync()
    offer(scene, "events")
    scene.proxy.on("GET", EVENTS, lambda e: event_stream(RETRY, (1.0, change(10**6)), hold=60),
                   forward=False)  # fmt: skip
    watcher_dev.restart()
    watch = Watcher(watcher_dev.path).start()
    try:
        before = len(pulls(scene))  # the first sync (at cursor 0) pulled the memory already
        wait_for(lambda: len(pulls(scene)) > before, "a pull after the hint")
        wait_for(lambda: watch.live is not None and watch.live.signals.hints >= 1, "the hint")
        assert all(e.query["cursor"] in ("0", "1") for e in pulls(scene))
    finally:
        watch.stop()
    assert watch.error is None
    assert memory in contents(watcher_dev)
    with watcher_dev.open() as session:
        assert session.state.cursor == 1  # what the relay's pages said, not the hint's 10^6


def test_bad_hints_are_counted_and_ignored(scene: Scene) -> None:
    dev = scene.device("bad-hints")
    offer(scene, "events")
    bad = [
        b"event: change\ndata: not json\n\n",
        change("5"),
        change(-1),
        change(2**64),
        change(True),
        b"event: change\ndata: [5]\n\n",
    ]
    scene.proxy.on("GET", EVENTS, lambda e: event_stream(RETRY, change(7), *bad, change(3),
                                                         hold=60), forward=False)  # fmt: skip
    dev.restart()
    watch = Watcher(dev.path).start()
    try:
        assert watch.live is not None
        signals = watch.live.signals
        wait_for(lambda: signals.bad_hints + signals.hints >= 8, "every hint read")
        assert (signals.hints, signals.bad_hints) == (1, 7)  # only 7; `3` goes back from 7
    finally:
        watch.stop()
    with dev.open() as session:
        assert session.state.cursor == 0  # nothing in the vault: no hint moved the cursor


def test_a_flood_of_hints_is_bounded_to_the_loops_pull_rate(scene: Scene) -> None:
    dev = scene.device("flood")
    offer(scene, "events")
    flood = [(0.01, change(n)) for n in range(1, 301)]  # 300 hints over 3 s or more
    scene.proxy.on("GET", EVENTS, lambda e: event_stream(RETRY, *flood, hold=60), forward=False)
    dev.restart()
    gap = 0.5
    watch = Watcher(dev.path, timing=LiveTiming(min_sync_gap_s=gap)).start()
    try:
        assert watch.live is not None
        signals = watch.live.signals
        wait_for(lambda: signals.hints >= 1, "the first hint")
        began, before = time.monotonic(), len(pulls(scene))
        wait_for(lambda: signals.hints >= 300, "the whole flood")
        elapsed, during = time.monotonic() - began, len(pulls(scene)) - before
    finally:
        watch.stop()
    assert during >= 1  # the hints did make it pull
    assert during <= elapsed / gap + 2, (during, elapsed)  # but never faster than the gap


def test_a_relay_that_closes_every_stream_at_once_is_not_hammered(scene: Scene) -> None:
    """Streams that end as soon as they begin: reconnects back off from the floor up; with
    the long-poll offered, the device falls back to it and still gets the news."""
    dev, writer = scene.device("closer"), scene.device("writer2", through_proxy=False)
    offer(scene, "events", "pull-wait")
    scene.proxy.on("GET", EVENTS, lambda e: event_stream(b"retry: 0\n\n: ping\n\n"),
                   forward=False)  # fmt: skip
    dev.restart()
    watch = Watcher(dev.path).start()
    try:
        began = time.monotonic()
        wait_for(lambda: streams(scene) >= 4, "four streams")
        elapsed = time.monotonic() - began
        floor = watch.feed_timing.reconnect_min_s
        assert streams(scene) <= elapsed / floor + 2, (streams(scene), elapsed)
    finally:
        watch.stop()
    assert watch.error is None
    # a stream that fails before any line: two of them, and the long-poll takes over
    scene.proxy.honest()
    offer(scene, "events", "pull-wait")
    scene.proxy.on("GET", EVENTS, lambda e: event_stream(), forward=False)
    watch = Watcher(dev.path).start()
    try:
        wait_for(lambda: watch.mode() == "long-poll", "the fall back to the long-poll")
        wait_for(lambda: any("wait" in e.query for e in scene.proxy.requests("GET", r"/pull$")),
                 "a long-poll")  # fmt: skip
        memory = add(writer, "news through the long-poll")
        writer.sync()
        wait_for(lambda: watch.applied >= 1, "the memory, through the long-poll")
    finally:
        watch.stop()
    assert memory in contents(dev)


@pytest.mark.parametrize(
    ("why", "answer"),
    [
        ("the route is missing", Answer(404, {"error": "not found", "code": "not_found"})),
        ("a proxy refuses the method", Answer(405, {"error": "no", "code": "method"})),
        ("a proxy answers in the relay's place", Answer(200, b"<html>hi</html>",
                                                       headers={"content-type": "text/html"})),
    ],
)  # fmt: skip
def test_a_stream_that_cannot_be_had_falls_back_to_the_long_poll(
    scene: Scene, why: str, answer: Answer
) -> None:
    dev, writer = scene.device("fallback"), scene.device("writer3", through_proxy=False)
    offer(scene, "events", "pull-wait")
    scene.proxy.on("GET", EVENTS, lambda e: answer, forward=False)
    dev.restart()
    watch = Watcher(dev.path).start()
    try:
        wait_for(lambda: watch.mode() == "long-poll", f"the long-poll ({why})")
        memory = add(writer, f"news although {why}")
        writer.sync()
        wait_for(lambda: watch.applied >= 1, "the memory, through the long-poll")
    finally:
        watch.stop()
    assert streams(scene) == 1, why  # unsupported: no second try
    assert memory in contents(dev)


def test_an_endless_line_drops_the_stream(scene: Scene, caplog: pytest.LogCaptureFixture) -> None:
    dev = scene.device("endless")
    offer(scene, "events")
    line = [(0.0, b"data: " + b"x" * 4096) for _ in range(64)]  # 256 KiB, no newline
    scene.proxy.on("GET", EVENTS, lambda e: event_stream(RETRY, *line, hold=60), forward=False)
    dev.restart()
    with caplog.at_level("WARNING", logger="engram_sync.client._sync.live_feed"):
        watch = Watcher(dev.path).start()
        try:
            wait_for(lambda: watch.mode() == "poll", "the fall back after two endless lines")
        finally:
            watch.stop()
    assert streams(scene) == 2
    assert any("passed 1024 bytes" in r.getMessage() for r in caplog.records)


def test_event_revoked_ends_the_watch(scene: Scene) -> None:
    dev = scene.device("revoked")
    offer(scene, "events")
    revoked = b'event: revoked\ndata: {"code": "device_revoked"}\n\n'
    scene.proxy.on("GET", EVENTS, lambda e: event_stream(RETRY, (0.5, revoked), hold=60),
                   forward=False)  # fmt: skip
    dev.restart()
    watch = Watcher(dev.path).start()
    wait_for(lambda: not watch.running, "the end of the watch")
    assert isinstance(watch.error, DeviceRevokedError)
    assert "revoked" in str(watch.error)
    with dev.open() as session:
        assert session.state.revoked


def _commit_between_pull_and_push(scene: Scene, writer_path: Any) -> Callable[[Exchange], None]:
    """A pull action that lets `writer` push one memory right after the device's pull, so
    another device's commit lands between the device's cursor and its own push."""

    def action(exchange: Exchange) -> None:
        with (
            VaultSession.open(writer_path, PASSPHRASE) as session,
            session.relay(max_retries=0) as client,
        ):
            session.syncer(client).sync()

    return action


@pytest.mark.parametrize("lie", [False, True])
def test_a_push_answer_that_hides_another_commit_is_caught(scene: Scene, lie: bool) -> None:
    """alpha at cursor c pulls; bravo commits c+1; alpha's push commits c+2. Honest: the
    answer's cursor (c+2) shows bravo's commit, so alpha pulls normally. The lie: cursor c+1,
    as if only alpha's own blob were there. alpha moves to c+1, past bravo's blob; its next
    pull from c+1 brings its own blob back (placed at c+1 or below by the lie), which
    refutes the move: it pulls again from c and gets bravo's memory."""
    alpha = scene.device("alpha")
    bravo = scene.device("bravo", through_proxy=False)
    offer(scene)  # no anti-entropy digest (PROTOCOL §18) either: only the cursor is tested
    add(alpha, "alpha first")
    alpha.sync()
    c = alpha.sync().cursor
    theirs = add(bravo, "bravo, between alpha's pull and push")
    bravo.restart()  # its session is opened again by the proxy's thread
    scene.proxy.on("GET", r"/pull$", _commit_between_pull_and_push(scene, bravo.path), times=1)
    if lie:
        scene.proxy.on("POST", r"/push$", rewrite_json(lambda v: v.update(cursor=c + 1)))
    add(alpha, "alpha second")
    first = alpha.sync()
    assert first.pushed == 1
    assert first.own_skipped == (1 if lie else 0)
    assert theirs not in contents(alpha)
    scene.proxy.honest()
    offer(scene)
    second = alpha.sync()
    assert second.own_skip_refuted is lie
    assert second.applied == 1
    assert theirs in contents(alpha)  # nothing of bravo's was skipped
    with alpha.open() as session:
        assert session.state.cursor == c + 2


def test_a_relay_without_events_is_followed_by_the_long_poll(scene: Scene) -> None:
    """/v1/info lists `pull-wait` but not `events` (an older relay, or a proxy known to
    buffer streams): no stream is tried; the long-poll brings the news."""
    dev, writer = scene.device("lp-only"), scene.device("writer4", through_proxy=False)
    offer(scene, "pull-wait")
    dev.restart()
    watch = Watcher(dev.path).start()
    try:
        wait_for(lambda: watch.mode() == "long-poll", "the long-poll")
        memory = add(writer, "news for a device without the event stream")
        writer.sync()
        wait_for(lambda: watch.applied >= 1, "the memory, through the long-poll")
    finally:
        watch.stop()
    assert streams(scene) == 0
    assert any("wait" in e.query for e in scene.proxy.requests("GET", r"/pull$"))
    assert memory in contents(dev)


def test_a_relay_without_either_is_polled_on_the_timer(scene: Scene) -> None:
    dev, writer = scene.device("timer-only"), scene.device("writer5", through_proxy=False)
    offer(scene)
    dev.restart()
    watch = Watcher(dev.path, interval=1.0).start()
    try:
        wait_for(lambda: watch.mode() == "poll", "polling")
        memory = add(writer, "news for a device polling on its timer")
        writer.sync()
        wait_for(lambda: watch.applied >= 1, "the memory, on the timer")
        assert any(s.state == "polling" for s in watch.statuses)
    finally:
        watch.stop()
    assert streams(scene) == 0
    assert not any("wait" in e.query for e in scene.proxy.requests("GET", r"/pull$"))
    assert memory in contents(dev)
