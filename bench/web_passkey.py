"""The web vault's passkey figure (issue 34 "Figures": passkey unlock after the gesture <= 300 ms;
docs/web-vault.md "Passkey unlock"), one row of `bench.web_vault`'s run, in Chromium:

`web_passkey_unlock`: seconds from the passkey's PRF output in the page (the `engram:gesture`
mark, set when `navigator.credentials.get` resolves) to the vault's memories listed: HKDF, the
session opened from its seal, the relay's passkey wrap fetched and opened, a device key minted,
the device registered, the pull, verify, decrypt and list. The vault holds one page (100
memories). The gesture is Chromium's virtual authenticator (CDP, PRF on, presence simulated),
so the figure holds no human time.

`web_passkey_vault_unlock`: the same for a passphrase vault (no account: web/js/
passkey-vault.js): from the PRF output to the memories listed: HKDF, the API key opened from its
seal, the vault's passkey wrap fetched and opened, the device registered, pull, verify, decrypt
and list. Set-up, not timed: the page unlocks with API key, vault id and passphrase, adds a
passkey (the passphrase asked again), reloads.

Set-up, not timed: an account made over HTTP as the Python client makes one (login secret, A
wrapped under the password, K wrapped under A), its vault seeded through a key it minted; the
page unlocks with the account, adds a passkey, reloads.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, Final

import httpx

from engram_sync.shared_format.b64 import b64encode_std
from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.login import login_secret
from engram_sync.shared_format.sync_keys import derive_sync_keys
from engram_sync.shared_format.wraps import (
    new_account_key,
    pack_vault_key,
    wrap_vault_key,
    wrap_with_secret,
)

PASSWORD: Final = "web passkey bench account password"  # noqa: S105 - bench data
AUTHENTICATOR: Final = {
    "protocol": "ctap2",
    "ctap2Version": "ctap2_1",
    "transport": "internal",
    "hasResidentKey": True,
    "hasUserVerification": True,
    "isUserVerified": True,
    "automaticPresenceSimulation": True,
    "hasPrf": True,
}
MARKS: Final = """() => Object.fromEntries(performance.getEntriesByType('mark')
  .map((m) => [m.name, m.startTime]))"""
Seed = Callable[[BlobCipher, str, str, str, int], None]


def make_account(relay_url: str, passphrase: str, seed: Seed, memories: int) -> tuple[str, str]:
    """(email, vault id): an account holding K of a vault of `memories` memories (PROTOCOL §13,
    as client/_accounts/account.py signs up and opens a vault)."""
    email = f"bench-{secrets.token_hex(4)}@example.org"
    vault_id = f"web-passkey-{secrets.token_hex(4)}"
    secret = login_secret(PASSWORD, email)
    keys = derive_sync_keys(passphrase)
    a = new_account_key()
    wrapped_a, salt_pw = wrap_with_secret(a, PASSWORD)
    wrapped_k = wrap_vault_key(pack_vault_key(keys.enc_key, keys.hmac_key, vault_id), a)
    with httpx.Client(base_url=relay_url, timeout=30) as http:
        signed = http.post("/auth/signup", json={"email": email, "password": secret})
        signed.raise_for_status()
        http.headers["Authorization"] = f"Bearer {signed.json()['session_token']}"
        wrap_a = {"wrapped_a": b64encode_std(wrapped_a), "salt_pw": b64encode_std(salt_pw)}
        http.put("/account/wraps/password", json={**wrap_a, "password": secret}).raise_for_status()
        wrap_k = {"wrapped_k": b64encode_std(wrapped_k), "password": secret}
        http.put(f"/account/vaults/{vault_id}/wrap", json=wrap_k).raise_for_status()
        minted = http.post("/account/keys", json={"vault_id": vault_id})
        minted.raise_for_status()
    seed(BlobCipher(keys), relay_url, minted.json()["key"], vault_id, memories)
    return email, vault_id


def _wait_status(page: Any, prefix: str) -> None:
    page.wait_for_function(
        "(prefix) => { const s = document.getElementById('status');"
        " return s.textContent.startsWith(prefix) || s.classList.contains('error'); }",
        arg=prefix,
    )
    said = page.inner_text("#status")
    if not said.startswith(prefix):
        raise RuntimeError(f"the page said {said!r}, not {prefix!r}…")


def passkey_marks(page: Any, url: str, email: str, vault_id: str, count: int) -> dict[str, float]:
    """The page's marks of one passkey unlock (after an account unlock and a passkey added)."""
    fields = {"#account-email": email, "#account-password": PASSWORD, "#account-vault-id": vault_id}
    return _marks_after_passkey(page, url, fields, "#account-unlock-button", PASSWORD, count)


def vault_passkey_marks(
    page: Any, url: str, key: str, vault_id: str, passphrase: str, count: int
) -> dict[str, float]:
    """The page's marks of one passkey unlock of a passphrase vault (after a passphrase unlock
    and a passkey added with the passphrase asked again)."""
    fields = {"#api-key": key, "#vault-id": vault_id, "#passphrase": passphrase}
    return _marks_after_passkey(page, url, fields, "#unlock-button", passphrase, count)


def _marks_after_passkey(
    page: Any, url: str, fields: dict[str, str], unlock_button: str, secret: str, count: int
) -> dict[str, float]:
    """Unlock with `fields`, add a passkey (`secret` asked again), reload, unlock with the
    passkey alone: the page's marks of that last unlock, its `count` memories listed."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("WebAuthn.enable", {"enableUI": False})
    cdp.send("WebAuthn.addVirtualAuthenticator", {"options": AUTHENTICATOR})
    page.goto(url.replace("127.0.0.1", "localhost"))  # a WebAuthn RP id is a name
    page.wait_for_selector("body[data-ready='1']", state="attached")
    for selector, value in fields.items():
        page.fill(selector, value)
    page.click(unlock_button)
    _wait_status(page, "Unlocked")
    page.fill("#passkey-password", secret)
    page.click("#passkey-add-button")
    _wait_status(page, "Passkey added")
    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    page.click("#passkey-unlock-button")
    _wait_status(page, "Unlocked")
    listed = page.locator("#memories li").count()
    if listed != count:
        raise RuntimeError(f"the page listed {listed} of {count} after the passkey unlock")
    marks: dict[str, float] = page.evaluate(MARKS)
    return marks


def section(marks: dict[str, float], memories: int) -> dict[str, Any]:
    """The `passkey` section of bench.web_vault's result."""
    return {
        "memories": memories,
        "after_gesture_s": (marks["engram:listed"] - marks["engram:gesture"]) / 1000,
        "with_gesture_s": (marks["engram:listed"] - marks["engram:unlock"]) / 1000,
    }
