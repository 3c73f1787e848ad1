"""The web vault served by a real relay at /vault/ (issue 34; relay/http/routes/web_vault.py)
in Chromium: the page unlocks and lists through the relay's own /v1/ (relative URLs from
/vault/, same origin); the relay's CSP refuses an injected inline script; and a module whose
bytes differ from the SRI string of index.html (a script tag's `integrity` or the import map's)
is not run, served through a tampering proxy in front of the relay."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_sync.client import Vault
from tests.client.web.tampering_proxy import TamperingProxy
from tests.e2e.conftest import PASSPHRASE, VAULT_ID, DeviceHandle, make_device
from tests.e2e.conftest import relay as relay  # the e2e relay fixture (a real relay)
from tests.relay.conftest import ADMIN_KEY, Relay
from tests.web.conftest import BrowserThread

INJECT = """async () => {
  const violations = [];
  document.addEventListener('securitypolicyviolation',
    (e) => violations.push(e.effectiveDirective));
  const inline = document.createElement('script');
  inline.textContent = 'window.ranInline = true';
  document.body.append(inline);
  await new Promise((r) => setTimeout(r, 200));
  return { ran: window.ranInline ?? false, violations };
}"""


@pytest.fixture
def device(tmp_path: Path, relay: Relay) -> Iterator[DeviceHandle]:
    handle = make_device(tmp_path, relay, "alpha")
    with handle.open() as session:
        vault = Vault(session)
        vault.add("served by the relay, checked by SRI", tags=["web"])
        vault.add("the second memory")
    handle.sync()
    yield handle
    handle.restart()


@pytest.fixture
def proxy(relay: Relay) -> Iterator[TamperingProxy]:
    with TamperingProxy(relay.url) as served:
        yield served


def _unlock_and_inject(page: Any, url: str) -> dict[str, Any]:
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", state="attached")
    page.fill("#api-key", ADMIN_KEY)
    page.fill("#vault-id", VAULT_ID)
    page.fill("#passphrase", PASSPHRASE)
    page.click("#unlock-button")
    page.wait_for_function("() => document.querySelectorAll('#memories li').length === 2")
    texts = page.locator("#memories li").all_inner_texts()
    injected: dict[str, Any] = page.evaluate(INJECT)
    return {"texts": texts, "injected": injected}


def test_the_page_under_vault_unlocks_lists_and_refuses_inline_script(
    browser: BrowserThread, relay: Relay, device: DeviceHandle
) -> None:
    seen = browser.run(lambda page: _unlock_and_inject(page, f"{relay.url}/vault/"), timeout=90)
    assert any("checked by SRI" in t for t in seen["texts"])
    assert seen["injected"]["ran"] is False
    assert "script-src-elem" in seen["injected"]["violations"]


def _load(page: Any, url: str) -> dict[str, Any]:
    messages: list[str] = []
    page.on("console", lambda m: messages.append(m.text))
    page.goto(url)
    try:
        page.wait_for_selector("body[data-ready='1']", state="attached", timeout=3000)
        ready = True
    except Exception:  # the page's modules never ran
        ready = False
    return {"ready": ready, "messages": messages}


def _tampered(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    return body + b"\n;globalThis.tampered = true;\n", headers


@pytest.mark.parametrize(
    "path",
    ["js/app.js", "js/search.js"],  # a script tag's integrity; the import map's (imported)
)
def test_a_module_with_a_wrong_sri_hash_is_not_run(
    browser: BrowserThread, proxy: TamperingProxy, path: str
) -> None:
    honest = browser.run(lambda page: _load(page, f"{proxy.url}/vault/"))
    assert honest["ready"] is True, honest["messages"]
    proxy.rules[path] = _tampered
    seen = browser.run(lambda page: _load(page, f"{proxy.url}/vault/"))
    assert seen["ready"] is False
    assert any("integrity" in m.lower() for m in seen["messages"]), seen["messages"]
