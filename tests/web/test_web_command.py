"""`engram-sync web` end to end (issue 34 slice 1; docs/web-vault.md): a vault with memories
written and synced by the Python client, `engram-sync web --no-open` as a subprocess, the page in
Chromium unlocks through its proxy, lists and searches them, adds one; the Python device's next
`sync` has it. The relay is real (uvicorn + PostgreSQL), so is every blob's crypto."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_sync.client import Vault
from tests.e2e.conftest import PASSPHRASE, VAULT_ID, DeviceHandle, make_device
from tests.e2e.conftest import relay as relay  # the e2e relay fixture (a real relay)
from tests.relay.conftest import ADMIN_KEY, Relay
from tests.web.conftest import BrowserThread

EXE = str(Path(sys.executable).parent / "engram-sync")
URL = re.compile(r"http://127\.0\.0\.1:\d+/")


@pytest.fixture
def device(tmp_path: Path, relay: Relay) -> Iterator[DeviceHandle]:
    handle = make_device(tmp_path, relay, "alpha")
    with handle.open() as session:
        vault = Vault(session)
        vault.add("bananas are berries", tags=["fruit"])
        vault.add("the relay stores only ciphertext", project="engram")
    handle.sync()
    yield handle
    handle.restart()


@pytest.fixture
def web_url(device: DeviceHandle) -> Iterator[str]:
    """`engram-sync --vault DIR web --no-open`, its URL read from its first line."""
    env = dict(os.environ, HOME=str(device.path.parent), COLUMNS="200")
    env.pop("ENGRAM_PASSPHRASE", None)  # the command needs no passphrase
    process = subprocess.Popen(
        [EXE, "--vault", str(device.path), "web", "--no-open"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = URL.search(line)
        assert found, f"no URL in {line!r}: {process.stderr.read() if process.stderr else ''}"
        yield found.group(0)
    finally:
        process.terminate()
        process.wait(10)


def unlock(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", state="attached")
    page.wait_for_function("() => document.getElementById('vault-id').value !== ''")
    assert page.input_value("#vault-id") == VAULT_ID  # from the linked vault's config
    page.fill("#api-key", ADMIN_KEY)
    page.fill("#passphrase", PASSPHRASE)
    page.click("#unlock-button")
    page.wait_for_function(
        "() => !document.getElementById('vault').hidden"
        " || document.getElementById('status').classList.contains('error')"
    )
    assert page.is_visible("#vault"), page.inner_text("#status")


def _list_search_add(page: Any, url: str) -> None:
    unlock(page, url)
    page.wait_for_function("() => document.querySelectorAll('#memories li').length === 2")
    texts = page.locator("#memories li").all_inner_texts()
    assert any("bananas are berries" in t for t in texts)
    assert any("the relay stores only ciphertext" in t for t in texts)
    page.fill("#search", "ciphertext relay")
    page.wait_for_function("() => document.querySelectorAll('#memories li').length === 1")
    assert "ciphertext" in page.inner_text("#memories li")
    page.fill("#search", "")
    page.fill("#add-content", "written in the browser")
    page.fill("#add-tags", "web, slice-1")
    page.click("#add-button")
    page.wait_for_function(
        "() => document.getElementById('status').textContent.startsWith('Added')"
    )
    assert page.locator("#memories li").count() == 3


def test_the_page_lists_searches_and_adds_and_the_python_device_syncs_it(
    browser: BrowserThread, web_url: str, device: DeviceHandle
) -> None:
    browser.run(lambda page: _list_search_add(page, web_url))
    report = device.sync()
    assert report.applied == 1
    assert report.invalid == 0
    with device.open() as session:
        added = [m for m in Vault(session).list() if m.content == "written in the browser"]
    assert len(added) == 1
    assert added[0].tags == ["web", "slice-1"]
    assert added[0].source == "user"


def test_the_server_answers_with_its_security_headers(web_url: str) -> None:
    import httpx

    answer = httpx.get(web_url, timeout=5)
    assert answer.status_code == 200
    assert "script-src 'self' 'wasm-unsafe-eval'" in answer.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    assert answer.headers["x-content-type-options"] == "nosniff"
    rebinding = httpx.get(web_url, headers={"Host": "evil.example"}, timeout=5)
    assert rebinding.status_code == 400
    started = time.monotonic()
    assert httpx.get(web_url + "js/app.js", timeout=5).status_code == 200
    assert time.monotonic() - started < 5
