"""Passkey unlock (issue 34 slice 4; docs/web-vault.md "Passkey unlock") in Chromium with its
virtual authenticator (CDP `WebAuthn.addVirtualAuthenticator`, PRF on, user verification on,
presence simulated): after an account unlock the page registers a passkey and stores K wrapped
under its PRF-derived key on the relay; after a reload the gesture alone unlocks; after the
passkey is removed, the same browser entry unlocks nothing. Real relay, PostgreSQL and crypto."""

from __future__ import annotations

import json
from typing import Any

from bench.web_passkey import AUTHENTICATOR  # the same virtual authenticator as the bench
from tests.e2e.conftest import DeviceHandle
from tests.e2e.conftest import relay as relay  # the e2e relay fixture (a real relay)
from tests.relay.conftest import Relay
from tests.web.conftest import BrowserThread
from tests.web.test_account_unlock import PASSWORD, account_unlock
from tests.web.test_account_unlock import device as device  # Python-made account and vault
from tests.web.test_web_command import web_url as web_url  # `engram-sync web --no-open`


def virtual_authenticator(page: Any) -> Any:
    cdp = page.context.new_cdp_session(page)
    cdp.send("WebAuthn.enable", {"enableUI": False})
    cdp.send("WebAuthn.addVirtualAuthenticator", {"options": AUTHENTICATOR})
    return cdp


def wait_status(page: Any, prefix: str) -> str:
    page.wait_for_function(
        "(prefix) => { const s = document.getElementById('status');"
        " return s.textContent.startsWith(prefix) || s.classList.contains('error'); }",
        arg=prefix,
    )
    return str(page.inner_text("#status"))


def passkey_unlock(page: Any) -> str:
    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    assert page.is_visible("#passkey-unlock-button")
    page.click("#passkey-unlock-button")
    return wait_status(page, "Unlocked")


def _register_unlock_remove(page: Any, url: str) -> dict[str, Any]:
    virtual_authenticator(page)
    said = account_unlock(page, url)
    assert page.is_visible("#vault"), said
    page.fill("#passkey-password", PASSWORD)
    page.click("#passkey-add-button")
    added = wait_status(page, "Passkey added")
    entry = json.loads(page.evaluate("() => localStorage.getItem('engram-passkey')"))

    requests: list[dict[str, Any]] = []

    def record(request: Any) -> None:
        requests.append({"url": request.url, "body": request.post_data_buffer or b""})

    page.context.on("request", record)
    unlocked = passkey_unlock(page)  # the gesture alone: no password typed
    page.wait_for_function("() => document.querySelectorAll('#memories li').length === 2")
    page.context.remove_listener("request", record)
    after_unlock = list(requests)

    page.fill("#passkey-password", PASSWORD)
    page.click("#passkey-remove-button")
    removed = wait_status(page, "Passkey removed")
    left = page.evaluate("() => localStorage.getItem('engram-passkey')")
    # the same entry put back (as a copy or backup of this browser's storage would): it opens
    # nothing, for the relay no longer holds the wrap
    page.evaluate("(e) => localStorage.setItem('engram-passkey', e)", json.dumps(entry))
    refused = passkey_unlock(page)
    return {"added": added, "entry": entry, "unlocked": unlocked, "requests": after_unlock,
            "removed": removed, "left": left, "refused": refused,
            "vault_shown": page.is_visible("#vault")}  # fmt: skip


def test_a_passkey_registers_unlocks_after_a_reload_and_after_removal_unlocks_nothing(
    browser: BrowserThread, web_url: str, device: DeviceHandle, relay: Relay
) -> None:
    url = web_url.replace("127.0.0.1", "localhost")  # a passkey needs a name, not an address
    seen = browser.run(lambda page: _register_unlock_remove(page, url), timeout=90)
    assert seen["added"].startswith("Passkey added"), seen["added"]
    # kept in the browser: public values and ciphertext only (the session token is sealed)
    assert set(seen["entry"]) == {"email", "vault_id", "credential_id", "prf_salt",
                                  "sealed_session"}  # fmt: skip
    assert "ses_" not in json.dumps(seen["entry"])
    assert seen["unlocked"].startswith("Unlocked"), seen["unlocked"]
    for request in seen["requests"]:  # the passkey unlock sent no password and no login secret
        assert PASSWORD.encode() not in request["body"]
        assert b"password" not in request["body"]
        assert not request["url"].endswith("/auth/signin")
    assert seen["removed"].startswith("Passkey removed"), seen["removed"]
    assert seen["left"] is None
    assert "was removed" in seen["refused"], seen["refused"]
    assert not seen["vault_shown"]
    assert relay.sql("SELECT count(*) AS n FROM passkey_wraps")[0]["n"] == 0
