"""Back to the event stream (issue 15, PROTOCOL §15; docs/live-sync.md): a watch that syncs
by the long-poll or by its timer, because the relay offered no stream, tries the stream
again after `FeedTiming.better_mode_retry_s` (5 minutes; 1 s here) by asking /v1/info
again. The relay on the watch's URL is first served with ENGRAM_RELAY_LIVE_FEED=long-poll
(or off), then replaced on the same port by one with the feed on; a memory pushed by
another device then reaches the watching one through the event stream (its timer never
fires). Real relay over HTTP, real PostgreSQL, real SQLCipher vaults."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import uvicorn

from engram_sync.client import Vault
from engram_sync.relay.services.config import RelayConfig
from engram_sync.relay.serving.app import create_app
from tests.e2e.conftest import PASSPHRASE, make_device
from tests.e2e.live_support import FAST_FEED, Watcher, wait_for
from tests.relay.conftest import Relay, base_config, free_port


class Served:
    """The relay app in a uvicorn thread on a given port (so a second one can take over
    the first one's URL)."""

    def __init__(self, config: RelayConfig, port: int) -> None:
        self.server = uvicorn.Server(
            uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive(), "the relay did not start"
            assert time.monotonic() < deadline, "the relay did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(params=["long-poll", "off"])
def first_relay(
    request: pytest.FixtureRequest, fresh_database_url: str, port: int
) -> Iterator[tuple[Relay, Served]]:
    config = replace(base_config(fresh_database_url), live_feed=request.param)
    served = Served(config, port)
    try:
        yield Relay(f"http://127.0.0.1:{port}", fresh_database_url, config), served
    finally:
        served.stop()


def test_the_watch_returns_to_the_event_stream(
    first_relay: tuple[Relay, Served], port: int, tmp_path: Path
) -> None:
    relay, first = first_relay
    fallback = "long-poll" if relay.config.live_feed == "long-poll" else "poll"
    alpha = make_device(tmp_path, relay, "alpha")
    bravo = make_device(tmp_path, relay, "bravo")
    timing = replace(FAST_FEED, better_mode_retry_s=1.0)
    watch = Watcher(alpha.path, feed_timing=timing).start()
    second: Served | None = None
    try:
        wait_for(lambda: watch.mode() == fallback, f"the watch on the {fallback} fallback")
        assert watch.live is not None
        first.stop()
        second = Served(replace(relay.config, live_feed="on"), port)
        signals = watch.live.signals
        wait_for(lambda: watch.mode() == "events" and signals.connected, "the event stream")
        with Vault.open(bravo.path, PASSPHRASE) as vault:
            memory = vault.add("from bravo, over the returned stream")
            vault.sync()
        wait_for(lambda: watch.applied >= 1, "bravo's memory on alpha")
        assert watch.mode() == "events"
        assert signals.hints >= 1  # the stream's hint made it sync: the timer never fires
    finally:
        watch.stop()
        if second is not None:
            second.stop()
    assert watch.error is None
    with Vault.open(alpha.path, PASSPHRASE) as vault:
        found = vault.get(memory)
        assert found is not None
        assert found.content == "from bravo, over the returned stream"
