"""Account unlock in the page (issue 34 slice 4, PROTOCOL §13; docs/web-vault.md "Account
unlock"): an account made with the Python client (client/_accounts) holds the vault's K; the page
signs in with email and password through `engram-sync web`'s proxy, opens A and K itself, mints a
key bound to its device and lists the vault. A relay lying about wrapped_k is refused, and no
request carries the password, A or K. Real relay, PostgreSQL, SQLCipher and crypto."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from engram_sync.client import Vault
from engram_sync.client._accounts import account
from engram_sync.shared_format.b64 import b64encode_std
from engram_sync.shared_format.login import login_secret
from engram_sync.shared_format.sync_keys import derive_sync_keys
from engram_sync.shared_format.wraps import pack_vault_key, wrap_vault_key
from tests.e2e.conftest import PASSPHRASE, VAULT_ID, DeviceHandle, make_device
from tests.e2e.conftest import relay as relay  # the e2e relay fixture (a real relay)
from tests.relay.conftest import Relay
from tests.web.conftest import BrowserThread
from tests.web.test_web_command import web_url as web_url  # `engram-sync web --no-open`

EMAIL = "Web.Person@Example.org"
PASSWORD = "the account password of the web person"
CONTENTS = ("bananas are berries", "the relay stores only ciphertext")


@pytest.fixture
def device(tmp_path: Path, relay: Relay) -> Iterator[DeviceHandle]:
    """A Python device with two memories synced, its K stored in a new account."""
    handle = make_device(tmp_path, relay, "alpha")
    with handle.open() as session:
        vault = Vault(session)
        for content in CONTENTS:
            vault.add(content)
    handle.sync()
    with handle.open() as session:
        account.signup(session.path, relay.url, EMAIL, PASSWORD)
        assert account.open_vault(session, PASSWORD) == VAULT_ID
    yield handle
    handle.restart()


def account_unlock(page: Any, url: str, vault_id: str = VAULT_ID) -> str:
    """Fill the account form; the status text once the page unlocked or refused."""
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", state="attached")
    page.wait_for_function("() => document.getElementById('account-vault-id').value !== ''")
    assert page.input_value("#account-vault-id") == VAULT_ID  # the linked vault's id
    page.fill("#account-email", EMAIL.upper())  # the page lower-cases it, as the relay does
    page.fill("#account-password", PASSWORD)
    page.fill("#account-vault-id", vault_id)
    page.click("#account-unlock-button")
    page.wait_for_function(
        "() => !document.getElementById('vault').hidden"
        " || document.getElementById('status').classList.contains('error')"
    )
    return str(page.inner_text("#status"))


def _unlock_observed(page: Any, url: str) -> dict[str, Any]:
    requests: list[dict[str, Any]] = []

    def record(request: Any) -> None:
        body = request.post_data_buffer
        requests.append({"url": request.url, "headers": request.all_headers(), "body": body or b""})

    page.context.on("request", record)  # the page's and its workers' requests
    said = account_unlock(page, url)
    assert page.is_visible("#vault"), said
    page.wait_for_function("() => document.querySelectorAll('#memories li').length === 2")
    shown = page.locator("#memories li").all_inner_texts()
    assert not page.is_visible("#account-unlock")
    assert page.is_visible("#passkey-add-button")  # offered after an account unlock
    storage = page.evaluate("() => Object.keys(localStorage).length + sessionStorage.length")
    return {"requests": requests, "shown": shown, "storage": storage}


def _needles(device: DeviceHandle) -> list[bytes]:
    """The password, A and K's keys, in every spelling a leak could take."""
    a = account.unlock(device.path, PASSWORD).account_key
    keys = derive_sync_keys(PASSPHRASE)
    texts = [PASSWORD, PASSPHRASE]
    for raw in (a, keys.enc_key, keys.hmac_key):
        texts += [raw.hex(), base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()]
    return [t.encode() for t in texts] + [a, keys.enc_key, keys.hmac_key]


def test_an_account_made_in_python_unlocks_its_vault_in_the_page_and_nothing_leaks(
    browser: BrowserThread, web_url: str, device: DeviceHandle, relay: Relay
) -> None:
    seen = browser.run(lambda page: _unlock_observed(page, web_url))
    assert all(any(c in t for t in seen["shown"]) for c in CONTENTS)
    secret = login_secret(PASSWORD, EMAIL)
    needles = _needles(device)
    for request in seen["requests"]:
        carried = [request["url"].encode(), unquote(request["url"]).encode(), request["body"]]
        carried += [v.encode() for v in request["headers"].values()]
        for needle in needles:
            assert not any(needle in c for c in carried), f"{request['url']} leaks"
        if secret.encode() in request["body"]:  # PROTOCOL §13: the sign-in, and only it
            assert request["url"].endswith("/auth/signin")
    assert sum(r["url"].endswith("/auth/signin") for r in seen["requests"]) == 1
    assert seen["storage"] == 0
    # the page pulled with a key minted for it and bound to its own device (PROTOCOL §10)
    (key,) = relay.sql(
        "SELECT k.device_id, d.label FROM api_keys k JOIN devices d ON d.device_id = k.device_id"
        " WHERE k.account_id IS NOT NULL"
    )
    assert key["label"] == "web vault (browser)"


def _refused(page: Any, url: str) -> str:
    said = account_unlock(page, url)
    assert not page.is_visible("#vault")
    return said


def test_a_relay_lying_about_the_vault_wrap_is_refused(
    browser: BrowserThread, web_url: str, device: DeviceHandle, relay: Relay
) -> None:
    a = account.unlock(device.path, PASSWORD).account_key
    other = wrap_vault_key(pack_vault_key(os.urandom(32), os.urandom(32), "another-vault"), a)
    wraps = [b64encode_std(other), b64encode_std(os.urandom(120))]
    before = len(relay.sql("SELECT 1 FROM api_keys"))
    said = []
    for wrap in wraps:  # the relay's own store lies (SQL outside the browser's thread)
        relay.sql("UPDATE vault_wraps SET wrapped_k = $1 WHERE vault_id = $2", wrap, VAULT_ID)
        said.append(browser.run(lambda page: _refused(page, web_url)))
    assert "holds the key of another vault" in said[0], said[0]
    assert "does not open with the account key" in said[1], said[1]
    assert all(s.startswith("Unlock failed") for s in said)
    assert len(relay.sql("SELECT 1 FROM api_keys")) == before  # nothing minted, nothing pulled
