"""The page as a full device against a CLI device (issue 34 slice 2; docs/web-vault.md): add,
edit and delete in the page seen on the CLI device, and the reverse shown by the live feed
without a reload (PROTOCOL §15); a page edit the relay rejects kept as a conflict copy, shown and
restored (PROTOCOL §8); the page's JSONL export byte-equal to `engram-sync export`."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from engram_sync.client import Vault
from tests.e2e.conftest import PASSPHRASE, DeviceHandle
from tests.web.conftest import BrowserThread
from tests.web.test_web_command import EXE, unlock
from tests.web.test_web_command import device as device  # a vault with 2 memories
from tests.web.test_web_command import relay as relay  # the real relay
from tests.web.test_web_command import web_url as web_url  # `engram-sync web --no-open`

LISTED_TWO = "() => document.querySelectorAll('#memories li').length === 2"
LIVE = "() => document.getElementById('live-mode').textContent === 'live updates: events'"


def _status_starts(page: Any, prefix: str) -> None:
    page.wait_for_function(
        f"() => document.getElementById('status').textContent.startsWith({prefix!r})"
    )


def _listed(page: Any, text: str, present: bool = True) -> None:
    """Wait until the list shows (or no longer shows) `text` (the status line may already
    say what a live pull found)."""
    check = "" if present else "!"
    page.wait_for_function(
        f"() => {check}[...document.querySelectorAll('#memories li')]"
        f".some((li) => li.textContent.includes({json.dumps(text)}))"
    )


def _page_writes(page: Any, url: str) -> None:
    unlock(page, url)
    page.wait_for_function(LISTED_TWO)
    page.fill("#add-content", "made in the page")
    page.click("#add-button")
    _listed(page, "made in the page")
    page.click("#edit-button")  # the added memory is in view
    page.fill("#edit-content", "edited in the page")
    page.click("#save-button")
    _listed(page, "edited in the page")
    page.click("#memories li:has-text('bananas are berries')")
    page.click("#delete-button")
    _listed(page, "bananas are berries", present=False)


def test_add_edit_and_delete_in_the_page_are_seen_on_the_cli_device(
    browser: BrowserThread, web_url: str, device: DeviceHandle
) -> None:
    browser.run(lambda page: _page_writes(page, web_url))
    report = device.sync()
    assert report.invalid == 0
    assert report.conflicts == 0
    with device.open() as session:
        contents = {m.content for m in Vault(session).list()}
    assert contents == {"the relay stores only ciphertext", "edited in the page"}


def _cli_writes_live(page: Any, url: str, device: DeviceHandle) -> list[str]:
    unlock(page, url)
    page.wait_for_function(LISTED_TWO)
    page.wait_for_function(LIVE)
    try:
        with device.open() as session:
            vault = Vault(session)
            ids = {m.content: m.id for m in vault.list()}
            vault.add("added on the CLI")
            vault.edit(ids["bananas are berries"], "bananas are still berries")
            vault.delete(ids["the relay stores only ciphertext"])
        device.sync()
    finally:
        device.restart()
    page.wait_for_function(  # no reload, no Sync click: the live feed
        "() => { const t = [...document.querySelectorAll('#memories li')]"
        ".map((li) => li.textContent).join('|'); return t.includes('added on the CLI')"
        " && t.includes('still berries') && !t.includes('only ciphertext'); }"
    )
    return page.locator("#memories li").all_inner_texts()


def test_cli_writes_appear_in_the_open_page_without_reload(
    browser: BrowserThread, web_url: str, device: DeviceHandle
) -> None:
    device.restart()  # opened again in the browser's thread
    shown = browser.run(lambda page: _cli_writes_live(page, web_url, device))
    assert len(shown) == 2


def _conflict(page: Any, url: str, device: DeviceHandle) -> dict[str, Any]:
    # no live feed and no long-poll: the page keeps its stale view of the memory
    page.route("**/events?*", lambda route: route.abort())
    page.route("**/pull?*wait=*", lambda route: route.abort())
    unlock(page, url)
    page.wait_for_function(LISTED_TWO)
    try:
        with device.open() as session:
            vault = Vault(session)
            target = next(m.id for m in vault.list() if m.content == "bananas are berries")
            vault.edit(target, "bananas, as the CLI says")
        device.sync()
    finally:
        device.restart()
    page.click("#memories li:has-text('bananas are berries')")
    page.click("#edit-button")
    page.fill("#edit-content", "bananas, as the page says")
    page.click("#save-button")
    _status_starts(page, "the relay holds a newer version")
    page.click("#sync-button")
    page.wait_for_selector("#conflict-list li")
    listed = page.locator("#conflict-list li").all_inner_texts()
    shown = page.locator("#memories li").all_inner_texts()
    page.click("#conflict-list li button")
    _status_starts(page, "Restored conflict #1")
    return {"conflicts": listed, "shown": shown, "device_id": device.name, "target": target}


def test_a_rejected_page_edit_is_kept_as_a_conflict_shown_and_restored(
    browser: BrowserThread, web_url: str, device: DeviceHandle
) -> None:
    device.restart()
    with device.open() as session:
        cli_device = session.device.device_id
    device.restart()
    seen = browser.run(lambda page: _conflict(page, web_url, device))
    (line,) = seen["conflicts"]
    assert re.match(rf"#1 {seen['target']} lost to {cli_device}@\d+ ", line)
    assert "bananas, as the page says" in line
    assert any("bananas, as the CLI says" in s for s in seen["shown"])
    device.sync()
    with device.open() as session:
        contents = {m.content for m in Vault(session).list()}
    assert "bananas, as the page says" in contents  # the restore is an ordinary new edit


def _export(page: Any, url: str) -> bytes:
    unlock(page, url)
    page.wait_for_function(LISTED_TWO)
    page.fill("#add-content", 'exported from the page: ünïcode, "quotes" and\nlines')
    page.fill("#add-tags", "b, a")
    page.fill("#add-project", "web")
    page.click("#add-button")
    _listed(page, "exported from the page")
    with page.expect_download() as download:
        page.click("#export-button")
    return Path(download.value.path()).read_bytes()


def test_the_page_export_equals_the_cli_export(
    browser: BrowserThread, web_url: str, device: DeviceHandle
) -> None:
    exported = browser.run(lambda page: _export(page, web_url))
    device.sync()
    device.restart()  # the CLI opens the vault itself
    env = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE, HOME=str(device.path.parent))
    cli = subprocess.run(
        [EXE, "--vault", str(device.path), "export"], env=env, capture_output=True, check=True
    )
    assert exported.count(b"\n") == 3
    assert exported == cli.stdout
