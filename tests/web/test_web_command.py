"""`engram-sync web` end to end (issue 34 slice 1; docs/web-vault.md): a vault with memories
written and synced by the Python client, `engram-sync web --no-open` as a subprocess, the page in
Chromium unlocks through its proxy, lists and searches them, adds one; the Python device's next
`sync` has it. The relay is real (uvicorn + PostgreSQL), so is every blob's crypto."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from engram_sync.client import Vault
from engram_sync.shared_format.sync_keys import derive_sync_keys
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
    assert not page.is_visible("#unlock")  # the credentials form is gone


def _list_search_add(page: Any, url: str) -> None:
    page.clock.install()  # the page's timers, fast-forwarded below for the idle lock
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
    page.clock.fast_forward("14:00")  # 14 minutes without input: still open
    assert page.is_visible("#vault")
    page.keyboard.press("Shift")  # input restarts the 15 minutes
    page.clock.fast_forward("14:00")
    assert page.is_visible("#vault")
    page.clock.fast_forward("01:01")  # 15 minutes after the last input: locked (a reload)
    page.wait_for_selector("#unlock", state="visible")
    assert not page.is_visible("#vault")


def test_the_page_lists_searches_adds_locks_when_idle_and_the_python_device_syncs_it(
    browser: BrowserThread, web_url: str, device: DeviceHandle, relay: Relay
) -> None:
    browser.run(lambda page: _list_search_add(page, web_url))
    # PROTOCOL §12: the page named itself on its pulls, so the relay recorded how far it
    (row,) = relay.sql(
        "SELECT pulled_cursor FROM devices WHERE vault_id = $1 AND label = $2",
        VAULT_ID,
        "web vault (browser)",
    )
    # pulled (2 before its own push; 3 once the live feed brought that push back):
    # compaction does not wait 30 days for it
    assert row["pulled_cursor"] in (2, 3)
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


SECRET_CONTENT = "the zero-knowledge secret: 7f3a orchid"


def _observed(page: Any, url: str) -> dict[str, Any]:
    """Every request the page makes while it unlocks, searches and adds; then its storage."""
    requests: list[dict[str, Any]] = []

    def record(request: Any) -> None:
        body = request.post_data_buffer
        requests.append({"url": request.url, "headers": request.all_headers(), "body": body or b""})

    page.context.on("request", record)  # the page's and its workers' requests
    unlock(page, url)
    page.wait_for_function("() => document.querySelectorAll('#memories li').length === 2")
    page.fill("#search", "bananas")
    page.fill("#search", "")
    page.fill("#add-content", SECRET_CONTENT)
    page.click("#add-button")
    page.wait_for_function(
        "() => document.getElementById('status').textContent.startsWith('Added')"
    )
    storage = page.evaluate(
        """async () => ({
          local: Object.keys(localStorage).length,
          session: Object.keys(sessionStorage).length,
          idb: (await indexedDB.databases()).map((d) => d.name),
          cookies: document.cookie,
          caches: (await caches.keys()).length,
        })"""
    )
    return {"requests": requests, "storage": storage, "sealed": page.evaluate(SEALED_RECORDS)}


# Every record the page keeps in IndexedDB (web/js/device-state.js), as [key, value] pairs.
SEALED_RECORDS = """() => new Promise((resolve, reject) => {
  const open = indexedDB.open('engram-web');
  open.onerror = () => reject(open.error);
  open.onsuccess = () => {
    const store = open.result.transaction('sealed').objectStore('sealed');
    const keys = store.getAllKeys();
    const values = store.getAll();
    values.onsuccess = () => { resolve(keys.result.map((k, i) => [k, values.result[i]]));
      open.result.close(); };
  };
})"""


def assert_sealed_only(records: list[Any], needles: list[bytes]) -> None:
    """Each record is {v: 1, nonce, ciphertext} under a 32-hex key, and no needle is in it."""
    assert records
    for key, value in records:
        assert re.fullmatch(r"[0-9a-f]{32}", key)
        assert set(value) == {"v", "nonce", "ciphertext"}
        assert value["v"] == 1
        assert len(base64.b64decode(value["nonce"], validate=True)) == 12
        assert len(base64.b64decode(value["ciphertext"], validate=True)) > 16
    dump = json.dumps(records).encode()
    for needle in needles:
        assert needle not in dump


def test_no_request_carries_the_passphrase_a_key_or_a_plaintext(
    browser: BrowserThread, web_url: str, device: DeviceHandle
) -> None:
    seen = browser.run(lambda page: _observed(page, web_url))
    keys = derive_sync_keys(PASSPHRASE)
    secrets = [PASSPHRASE, "bananas are berries", "the relay stores only ciphertext",
               SECRET_CONTENT]  # fmt: skip
    for raw in (keys.enc_key, keys.hmac_key):
        secrets += [
            raw.hex(),
            base64.b64encode(raw).decode(),
            base64.urlsafe_b64encode(raw).decode(),
        ]
    needles = [s.encode() for s in secrets] + [keys.enc_key, keys.hmac_key]
    assert len(seen["requests"]) > 5
    pushes = [r for r in seen["requests"] if r["url"].endswith("/push")]
    assert len(pushes) == 1  # the added memory went out, as ciphertext
    for request in seen["requests"]:
        for name, value in request["headers"].items():
            if name == "authorization":
                assert value == f"Bearer {ADMIN_KEY}"  # the API key, there and only there
            for needle in needles:
                assert needle not in value.encode(), f"{name} of {request['url']} leaks"
        for needle in needles:
            assert needle not in request["url"].encode()
            assert needle not in request["body"], f"the body of {request['url']} leaks"
            assert needle not in unquote(request["url"]).encode()
        assert ADMIN_KEY not in request["url"]
        assert ADMIN_KEY.encode() not in request["body"]
    # IndexedDB holds the sealed device state (web/js/device-state.js) and nothing else
    assert seen["storage"] == {
        "local": 0, "session": 0, "idb": ["engram-web"], "cookies": "", "caches": 0,
    }  # fmt: skip
    (pushed,) = json.loads(pushes[0]["body"])["blobs"]
    own = [pushed["device_id"].encode(), VAULT_ID.encode()]
    assert_sealed_only(seen["sealed"], needles + own)


HOSTILE = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script> hostile text'


def _delete_then_pull(page: Any, url: str, device: DeviceHandle) -> dict[str, Any]:
    """The page deletes a memory; the Python device (opened and closed in this thread: SQLite
    connections stay in their thread) adds one with markup in it and syncs; the page's Sync
    lists it as text; a reload locks the page."""
    unlock(page, url)
    page.wait_for_function("() => document.querySelectorAll('#memories li').length === 2")
    page.click("#memories li:has-text('bananas are berries')")
    page.click("#delete-button")
    page.wait_for_function(
        "() => document.getElementById('status').textContent.startsWith('Deleted')"
    )
    try:
        with device.open() as session:
            Vault(session).add(HOSTILE)
        first = device.sync()
    finally:
        device.restart()
    page.click("#sync-button")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#memories li')].some((li) =>"
        " li.textContent.includes('hostile text'))"
    )
    shown = page.locator("#memories li").all_inner_texts()
    injected = page.evaluate(
        "() => [window.pwned ?? null, document.querySelectorAll('#memories img, #memories script')"
        ".length]"
    )
    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    locked = [page.is_visible("#unlock"), page.is_visible("#vault")]
    return {"applied": first.applied, "shown": shown, "injected": injected, "locked": locked}


def test_a_deletion_in_the_page_and_a_python_write_cross_and_markup_stays_text(
    browser: BrowserThread, web_url: str, device: DeviceHandle
) -> None:
    device.restart()  # closed here, opened again in the browser's thread
    seen = browser.run(lambda page: _delete_then_pull(page, web_url, device))
    assert seen["applied"] == 1  # the page's tombstone, applied on the Python device
    assert len(seen["shown"]) == 2
    assert any(HOSTILE in text for text in seen["shown"])  # the markup, as text
    assert not any("bananas" in text for text in seen["shown"])
    assert seen["injected"] == [None, 0]
    assert seen["locked"] == [True, False]  # a reload drops the keys and the set
    with device.open() as session:
        contents = {m.content for m in Vault(session).list()}
    assert contents == {"the relay stores only ciphertext", HOSTILE}
