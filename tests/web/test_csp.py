"""The Content-Security-Policy `engram-sync web` sends (client/_web/headers.py) holds in
Chromium: an injected inline script, an inline event handler, a string timer (eval), a
script from another origin and a connection to another origin are all refused, and each is
reported as a violation; the page's own modules, its Worker and WebAssembly (Argon2id) run."""

from __future__ import annotations

from typing import Any

from tests.web.conftest import BrowserThread, open_bundle

PROBE = """async () => {
  const violations = [];
  document.addEventListener('securitypolicyviolation',
    (e) => violations.push(e.effectiveDirective));
  const inline = document.createElement('script');
  inline.textContent = 'window.ranInline = true';
  document.body.append(inline);
  const handler = document.createElement('img');
  handler.setAttribute('onerror', 'window.ranHandler = true');
  handler.src = 'missing.png';
  document.body.append(handler);
  // A string timer is eval from the page's own event loop (code run by the test itself
  // through DevTools may eval: CDP allows it), so CSP decides.
  setTimeout('window.ranTimer = true', 0);
  const foreign = document.createElement('script');
  foreign.src = 'http://127.0.0.1:9/x.js';
  document.body.append(foreign);
  let fetched = 'refused';
  try { await fetch('http://127.0.0.1:9/v1/info'); fetched = 'sent'; }
  catch (e) { fetched = e.name; }
  const kdf = await import('./js/kdf.js');
  const vaultId = await kdf.vaultIdV1('x');  // Worker + WebAssembly
  await new Promise((r) => setTimeout(r, 200));
  return { inline: window.ranInline ?? false, handler: window.ranHandler ?? false,
    timer: window.ranTimer ?? false,
    fetched, vaultId: vaultId.length, violations: [...new Set(violations)].sort() };
}"""


def test_the_policy_refuses_injected_code_and_lets_the_page_run(
    browser: BrowserThread, bundle_url: str
) -> None:
    seen: dict[str, Any] = browser.run(lambda page: open_bundle(page, bundle_url).evaluate(PROBE))
    assert seen["inline"] is False
    assert seen["handler"] is False
    assert seen["timer"] is False
    assert seen["fetched"] == "TypeError"
    assert seen["vaultId"] == 64
    assert {"script-src-elem", "script-src-attr", "script-src", "connect-src"} <= set(
        seen["violations"]
    )
