"""Passkey unlock of a passphrase vault (docs/web-vault.md "Passkey unlock"; web/js/
passkey-vault.js) in Chromium with its virtual authenticator: a vault unlocked with an API key,
vault id and passphrase registers a passkey (the passphrase asked again; a wrong one adds
nothing); after a reload the gesture alone unlocks (the API key opened from its seal, the wrap
fetched under it); after removal the same entry unlocks nothing. Zero knowledge observed from
outside: no request carries the passphrase, the API key outside its header, or K's halves, and
the kept entry holds public values and ciphertext only. Real relay, PostgreSQL and crypto."""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import unquote

from engram_sync.shared_format.sync_keys import derive_sync_keys
from tests.e2e.conftest import PASSPHRASE, VAULT_ID, DeviceHandle
from tests.relay.conftest import Relay
from tests.web.conftest import BrowserThread
from tests.web.test_passkey_unlock import passkey_unlock, virtual_authenticator, wait_status
from tests.web.test_web_command import device as device  # a vault with 2 memories
from tests.web.test_web_command import relay as relay  # the real relay
from tests.web.test_web_command import web_url as web_url  # `engram-sync web --no-open`


def _unlock_with_passphrase(page: Any, url: str, api_key: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", state="attached")
    page.wait_for_function("() => document.getElementById('vault-id').value !== ''")
    page.fill("#api-key", api_key)
    page.fill("#passphrase", PASSPHRASE)
    page.click("#unlock-button")
    page.wait_for_function("() => document.querySelectorAll('#memories li').length === 2")


def _add(page: Any, passphrase: str) -> str:
    page.evaluate(
        "() => { const s = document.getElementById('status');"
        " s.textContent = ''; s.classList.remove('error'); }"
    )
    page.fill("#passkey-password", passphrase)
    page.click("#passkey-add-button")
    return wait_status(page, "Passkey")


def _register_unlock_remove(page: Any, url: str, api_key: str) -> dict[str, Any]:
    virtual_authenticator(page)
    requests: list[dict[str, Any]] = []

    def record(request: Any) -> None:
        requests.append({"url": request.url, "headers": request.headers,
                         "body": request.post_data_buffer or b""})  # fmt: skip

    page.context.on("request", record)
    _unlock_with_passphrase(page, url, api_key)
    wrong = _add(page, "not the passphrase")
    after_wrong = page.evaluate("() => localStorage.getItem('engram-passkey')")
    added = _add(page, PASSPHRASE)
    entry = json.loads(page.evaluate("() => localStorage.getItem('engram-passkey')"))
    typed_from = len(requests)  # from here on nothing is typed: the gesture alone
    unlocked = passkey_unlock(page)
    page.wait_for_function("() => document.querySelectorAll('#memories li').length === 2")
    typed = list(requests[typed_from:])
    page.click("#passkey-remove-button")
    removed = wait_status(page, "Passkey removed")
    page.context.remove_listener("request", record)
    left = page.evaluate("() => localStorage.getItem('engram-passkey')")
    page.evaluate("(e) => localStorage.setItem('engram-passkey', e)", json.dumps(entry))
    refused = passkey_unlock(page)
    return {"wrong": wrong, "after_wrong": after_wrong, "added": added, "entry": entry,
            "unlocked": unlocked, "requests": requests, "after_gesture": typed,
            "removed": removed, "left": left, "refused": refused,
            "vault_shown": page.is_visible("#vault")}  # fmt: skip


def _needles(api_key: str) -> list[bytes]:
    keys = derive_sync_keys(PASSPHRASE)
    found = [PASSPHRASE.encode(), keys.enc_key, keys.hmac_key]
    for raw in (keys.enc_key, keys.hmac_key):
        for text in (raw.hex(), base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
            found.append(text.encode() if isinstance(text, str) else text)
    return [*found, api_key.encode()]


def test_a_passphrase_vault_registers_a_passkey_unlocks_by_gesture_and_after_removal_not(
    browser: BrowserThread, web_url: str, device: DeviceHandle, relay: Relay
) -> None:
    api_key = relay.mint(VAULT_ID)  # an ordinary key of the vault (not the operator's)
    url = web_url.replace("127.0.0.1", "localhost")  # a passkey needs a name, not an address
    seen = browser.run(lambda page: _register_unlock_remove(page, url, api_key), timeout=120)
    assert "not the unlocked vault's" in seen["wrong"], seen["wrong"]
    assert seen["after_wrong"] is None  # a wrong passphrase added nothing
    assert seen["added"].startswith("Passkey added"), seen["added"]
    # kept in the browser: public values and ciphertext only (the API key is sealed)
    assert set(seen["entry"]) == {"vault_id", "credential_id", "prf_salt", "sealed_api_key"}
    assert seen["entry"]["vault_id"] == VAULT_ID
    assert seen["unlocked"].startswith("Unlocked"), seen["unlocked"]
    assert any("/passkeys/" in r["url"] for r in seen["after_gesture"])  # the wrap was fetched
    puts = [r for r in seen["requests"] if "/passkeys/" in r["url"] and r["body"]]
    assert len(puts) == 1
    assert set(json.loads(puts[0]["body"])) == {"wrapped_k", "prf_salt"}
    for needle in _needles(api_key):  # nothing kept in the browser is a secret
        assert needle not in json.dumps(seen["entry"]).encode()
    for request in seen["requests"]:
        for needle in _needles(api_key):
            assert needle not in request["body"], f"the body of {request['url']} leaks"
            assert needle not in unquote(request["url"]).encode()
        for name, value in request["headers"].items():
            if name != "authorization":
                assert api_key not in value
                assert PASSPHRASE not in value
    for request in seen["after_gesture"]:  # the gesture alone: no passphrase went anywhere
        assert not request["body"] or b"passphrase" not in request["body"]
    assert seen["removed"].startswith("Passkey removed"), seen["removed"]
    assert seen["left"] is None
    assert "was removed" in seen["refused"], seen["refused"]
    assert not seen["vault_shown"]
    assert relay.sql("SELECT count(*) AS n FROM vault_passkey_wraps")[0]["n"] == 0
