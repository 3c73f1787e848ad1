"""The page against a lying relay (the hostile-relay harness of tests/e2e/hostile: a real relay
process behind a proxy that rewrites its answers), as the Python client is tested there: a
forged cursor page is refused whole and reported in the page, nothing of it listed; a blob whose
fields were changed on the way is skipped and reported, the rest of the page applied."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_sync.client import Vault
from engram_sync.client._session import VaultSession
from engram_sync.client._web.app import build_app
from engram_sync.client._web.bundle import bundle_dir
from tests.e2e.conftest import PASSPHRASE
from tests.e2e.hostile.conftest import proxy as proxy  # a lying proxy per test
from tests.e2e.hostile.conftest import relay_process as relay_process  # the real relay
from tests.e2e.hostile.proxy import Answer, HostileProxy, event_stream, rewrite_json
from tests.relay.conftest import ADMIN_KEY
from tests.web.conftest import BrowserThread, ServedApp, open_bundle


@pytest.fixture
def vault_id(proxy: HostileProxy, tmp_path: Path) -> str:
    """A vault of two memories, pushed through the (still honest) proxy."""
    chosen = f"web-hostile-{secrets.token_hex(4)}"
    with VaultSession.open(tmp_path / "alpha", PASSPHRASE, create=True) as session:
        session.link(proxy.url, ADMIN_KEY, chosen, "alpha")
        vault = Vault(session)
        vault.add("first memory")
        vault.add("second memory")
        vault.sync()
    return chosen


@pytest.fixture
def web_url(proxy: HostileProxy, vault_id: str) -> Iterator[str]:
    with ServedApp(build_app(bundle_dir(), proxy.url, vault_id)) as served:
        yield served.url


def _unlock(page: Any, url: str) -> dict[str, Any]:
    open_bundle(page, url)
    page.wait_for_function("() => document.getElementById('vault-id').value !== ''")
    page.fill("#api-key", ADMIN_KEY)
    page.fill("#passphrase", PASSPHRASE)
    page.click("#unlock-button")
    page.wait_for_function(
        "() => document.getElementById('status').textContent.startsWith('Unlocked')"
        " || document.getElementById('status').classList.contains('error')"
    )
    return {
        "status": page.inner_text("#status"),
        "listed": page.locator("#memories li").all_inner_texts(),
        "problems": page.locator("#problem-list li").all_inner_texts(),
    }


def test_a_cursor_moved_back_is_refused_and_nothing_listed(
    browser: BrowserThread, proxy: HostileProxy, web_url: str
) -> None:
    proxy.on("GET", r"/pull$", rewrite_json(lambda page: {**page, "cursor": 0}))
    seen = browser.run(lambda page: _unlock(page, web_url))
    assert seen["status"].startswith("Unlock failed")
    assert "page was refused and nothing of it applied" in seen["status"]
    assert len(seen["problems"]) == 1
    assert "sent cursor 0 after a last blob of sequence 2" in seen["problems"][0]
    assert seen["listed"] == []


def test_a_blob_changed_on_the_way_is_skipped_and_reported(
    browser: BrowserThread, proxy: HostileProxy, web_url: str
) -> None:
    def forge(page: dict[str, Any]) -> None:
        page["blobs"][0]["device_id"] = "someone-else"  # under the HMAC of PROTOCOL §3

    proxy.on("GET", r"/pull$", rewrite_json(forge))
    seen = browser.run(lambda page: _unlock(page, web_url))
    assert seen["status"].startswith("Unlocked: 1 memories")
    assert "1 skipped" in seen["status"]
    assert len(seen["listed"]) == 1
    assert len(seen["problems"]) == 1
    assert "HMAC mismatch" in seen["problems"][0]
    assert "someone-else" in seen["problems"][0]


def _forged_events(page: Any, url: str) -> dict[str, Any]:
    seen = _unlock(page, url)
    page.wait_for_function("() => document.querySelectorAll('#problem-list li').length >= 2")
    return {**seen, "problems": page.locator("#problem-list li").all_inner_texts(),
            "after": page.locator("#memories li").all_inner_texts()}  # fmt: skip


def test_forged_live_events_are_refused_and_reported(
    browser: BrowserThread, proxy: HostileProxy, web_url: str
) -> None:
    # PROTOCOL §15: a change event is a hint; one whose cursor is not an integer, or goes
    # back on the stream, is refused and reported, never acted on
    stream = event_stream(
        b"retry: 2000\n\n",
        (0.05, b'event: change\ndata: {"cursor": "2; DROP"}\n\n'),
        (0.05, b'event: change\ndata: {"cursor": 2}\n\n'),
        (0.05, b'event: change\ndata: {"cursor": 1}\n\n'),
        hold=3,
    )
    proxy.on("GET", r"/events$", lambda _: stream, forward=False)
    seen = browser.run(lambda page: _forged_events(page, web_url))
    assert seen["status"].startswith("Unlocked: 2 memories")
    assert seen["problems"] == [
        'refused a live event from the relay: cursor "2; DROP" is not an integer 0..2^53-1',
        "refused a live event from the relay: cursor 1 goes back from 2",
    ]
    assert len(seen["after"]) == 2


def _long_poll(page: Any, url: str, vault_dir: Path) -> dict[str, Any]:
    seen = _unlock(page, url)
    page.wait_for_function(
        "() => document.getElementById('live-mode').textContent === 'live updates: long-poll'"
    )
    with VaultSession.open(vault_dir, PASSPHRASE) as session:  # this thread's connection
        vault = Vault(session)
        vault.add("third memory, seen through the long-poll")
        vault.sync()
    page.wait_for_function("() => document.querySelectorAll('#memories li').length === 3")
    return {**seen, "after": page.locator("#memories li").all_inner_texts()}


def test_without_the_event_stream_the_page_long_polls(
    browser: BrowserThread, proxy: HostileProxy, web_url: str, tmp_path: Path
) -> None:
    # PROTOCOL §15 fallback: a proxy that answers the stream 404 leaves the long-poll
    # (pull?cursor=N&wait=S); a Python write appears in the page without a Sync click
    gone = Answer(status=404, body={"error": "no streams here", "code": "not_found"})
    proxy.on("GET", r"/events$", lambda _: gone, forward=False)
    seen = browser.run(lambda page: _long_poll(page, web_url, tmp_path / "alpha"))
    assert any("seen through the long-poll" in text for text in seen["after"])
    assert proxy.requests("GET", r"/pull$")  # and some of them held (wait=25)
    assert any(e.query.get("wait") == "25" for e in proxy.requests("GET", r"/pull$"))
