"""The page's device across reloads (web/js/device-state.js, docs/web-vault.md "Device across
reloads"): a reload and a second unlock keep the device id, clock and cursor (the relay's roster
shows one browser device, the next push carries a higher clock, the pull resumes from the kept
cursor); a tampered record is ignored and reported, and the page registers as a new device."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.e2e.conftest import PASSPHRASE, VAULT_ID, DeviceHandle
from tests.relay.conftest import ADMIN_KEY, Relay
from tests.web.conftest import BrowserThread
from tests.web.test_web_command import device as device  # a vault with 2 memories
from tests.web.test_web_command import relay as relay  # the real relay
from tests.web.test_web_command import unlock
from tests.web.test_web_command import web_url as web_url  # `engram-sync web --no-open`

LABEL = "web vault (browser)"
LISTED_TWO = "() => document.querySelectorAll('#memories li').length >= 2"


def _add(page: Any, content: str) -> None:
    page.fill("#add-content", content)
    page.click("#add-button")
    page.wait_for_function(
        f"() => document.getElementById('status').textContent.startsWith('Added')"
        f" && document.body.textContent.includes({json.dumps(content)})"
    )


def _unlocked_again(page: Any, url: str) -> None:
    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    unlock(page, url)
    page.wait_for_function(LISTED_TWO)


def _reload_keeps(page: Any, url: str) -> dict[str, Any]:
    requests: list[Any] = []
    page.on("request", lambda request: requests.append(request))
    unlock(page, url)
    page.wait_for_function(LISTED_TWO)
    _add(page, "before the reload")
    first = page.inner_text("#status")
    before_reload = len(requests)
    _unlocked_again(page, url)
    _add(page, "after the reload")
    pulled = [next(r.url for r in part if "/pull?" in r.url)
              for part in (requests[:before_reload], requests[before_reload:])]  # fmt: skip
    pushes = [json.loads(r.post_data)["blobs"][0] for r in requests if r.url.endswith("/push")]
    return {
        "first": first, "second": page.inner_text("#status"),
        "cursors": [parse_qs(urlsplit(u).query)["cursor"][0] for u in pulled],
        "pushes": [(b["device_id"], b["vector_clock"]) for b in pushes],
        "listed": page.locator("#memories li").count(),
    }  # fmt: skip


def test_a_reload_keeps_the_device_its_clock_and_cursor(
    browser: BrowserThread, web_url: str, device: DeviceHandle, relay: Relay
) -> None:
    seen = browser.run(lambda page: _reload_keeps(page, web_url))
    (first, clock1), (second, clock2) = seen["pushes"]
    assert first == second  # one device across the reload
    assert clock2 > clock1  # the kept clock: never a clock value used again
    # the second unlock resumes from the kept cursor (3 when the page's own push came back
    # on the live feed before the reload)
    assert seen["cursors"][0] == "0"
    assert seen["cursors"][1] in ("2", "3")
    assert seen["listed"] == 4  # the kept set, the pulled one and the new one
    rows = relay.sql(
        "SELECT device_id FROM devices WHERE vault_id = $1 AND label = $2", VAULT_ID, LABEL
    )
    assert [r["device_id"] for r in rows] == [first]  # the roster shows one browser device


TAMPER = """() => new Promise((resolve, reject) => {
  const open = indexedDB.open('engram-web');
  open.onerror = () => reject(open.error);
  open.onsuccess = () => {
    const tx = open.result.transaction('sealed', 'readwrite');
    let flipped = 0;
    tx.objectStore('sealed').openCursor().onsuccess = (event) => {
      const cursor = event.target.result;
      if (!cursor) return;
      const raw = atob(cursor.value.ciphertext);
      const changed = String.fromCharCode(raw.charCodeAt(0) ^ 1) + raw.slice(1);
      cursor.update({ ...cursor.value, ciphertext: btoa(changed) });
      flipped++;
      cursor.continue();
    };
    tx.oncomplete = () => { open.result.close(); resolve(flipped); };
    tx.onerror = () => reject(tx.error);
  };
})"""


def _tampered(page: Any, url: str) -> dict[str, Any]:
    unlock(page, url)
    page.wait_for_function(LISTED_TWO)
    first = page.inner_text("#status")
    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    flipped = page.evaluate(TAMPER)
    unlock(page, url)
    page.wait_for_function(LISTED_TWO)
    return {
        "flipped": flipped, "first": first, "second": page.inner_text("#status"),
        "problems": page.locator("#problem-list li").all_inner_texts(),
    }  # fmt: skip


def test_a_tampered_device_record_is_ignored_reported_and_a_new_device_registers(
    browser: BrowserThread, web_url: str, device: DeviceHandle, relay: Relay
) -> None:
    seen = browser.run(lambda page: _tampered(page, web_url))
    assert seen["flipped"] == 2  # the device record and the set record
    assert "the stored device record was ignored: it does not open" in seen["problems"][0]
    assert "registers as a new device" in seen["problems"][0]
    assert "the stored set record was ignored" in seen["problems"][1]
    device_of = [s.split("device ")[1][:8] for s in (seen["first"], seen["second"])]
    assert device_of[0] != device_of[1]  # not trusted: a new device
    rows = relay.sql("SELECT 1 FROM devices WHERE vault_id = $1 AND label = $2", VAULT_ID, LABEL)
    assert len(rows) == 2


def _revoked(page: Any, url: str, relay: Relay) -> dict[str, Any]:
    import httpx

    registered: list[str] = []
    page.on(
        "request",
        lambda r: (
            registered.append(json.loads(r.post_data)["device_id"])
            if r.url.endswith("/devices/register")
            else None
        ),
    )
    unlock(page, url)
    page.wait_for_function(LISTED_TWO)
    row = {"device_id": registered[0]}
    answer = httpx.delete(
        f"{relay.url}/v1/vaults/{VAULT_ID}/devices/{row['device_id']}",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=5,
    )
    assert answer.status_code == 200
    page.fill("#add-content", "after the revocation")
    page.click("#add-button")
    page.wait_for_function(
        "() => document.getElementById('status').textContent.includes('revoked')"
    )
    refused = page.inner_text("#status")
    _unlocked_again(page, url)
    return {"revoked": row["device_id"], "refused": refused, "second": page.inner_text("#status")}


def test_a_revoked_device_is_not_kept_for_the_next_unlock(
    browser: BrowserThread, web_url: str, device: DeviceHandle, relay: Relay
) -> None:
    seen = browser.run(lambda page: _revoked(page, web_url, relay))
    assert "was revoked" in seen["refused"]
    assert seen["revoked"][:8] not in seen["second"]  # the next unlock: a new device
    rows = relay.sql(
        "SELECT revoked_at IS NOT NULL AS revoked FROM devices WHERE vault_id = $1"
        " AND label = $2 ORDER BY revoked_at NULLS LAST",
        VAULT_ID,
        LABEL,
    )
    assert [r["revoked"] for r in rows] == [True, False]


def _two_tabs(page: Any, url: str) -> dict[str, Any]:
    unlock(page, url)
    page.wait_for_function(LISTED_TWO)
    second = page.context.new_page()
    second.goto(url)
    second.wait_for_selector("body[data-ready='1']", state="attached")
    second.fill("#api-key", ADMIN_KEY)
    second.fill("#passphrase", PASSPHRASE)
    second.click("#unlock-button")
    second.wait_for_function("() => document.getElementById('status').classList.contains('error')")
    refused = {"status": second.inner_text("#status"), "vault": second.is_visible("#vault")}
    page.close()  # the first tab goes: its lock with it
    second.reload()
    unlock(second, url)
    second.wait_for_function(LISTED_TWO)
    return {"refused": refused, "after": second.inner_text("#status")}


def test_a_second_tab_of_the_vault_is_refused_until_the_first_goes(
    browser: BrowserThread, web_url: str, device: DeviceHandle
) -> None:
    """Two tabs would share the device's sealed records and clock (each overwriting the
    other's set record): the second is refused in words while the first holds the vault, and
    unlocks once it is closed."""
    seen = browser.run(lambda page: _two_tabs(page, web_url))
    assert "open in another tab" in seen["refused"]["status"]
    assert seen["refused"]["vault"] is False
    assert seen["after"].startswith("Unlocked")
