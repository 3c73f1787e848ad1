"""The web vault's live rows (issue 34 "Figures"; docs/web-vault.md), in Debian's Chromium:

1. `web_live_to_cli`: milliseconds from a memory added in the page (the Add form submitted) to
   that memory in a CLI device's vault, the device running `Vault.watch` (the real live sync,
   its event stream, the timer set to an hour): the page seals and pushes, the relay's event
   wakes the device, it pulls, verifies, decrypts and commits. p50 of S adds. Target <= 200 ms.
2. `web_live_from_cli`: milliseconds from a memory added on that CLI device (`Vault.add`
   through a second connection, the watch woken as its docs say) to that memory listed in the
   open page (a MutationObserver's stamp): the watch pushes, the relay's event reaches the
   page's fetch stream, the page pulls, checks, verifies, decrypts and lists. p50 of S adds.
   Target <= 200 ms.

Adds are spaced by the watch's own floor between two syncs (LiveTiming.min_sync_gap_s, 0.5 s,
plus 0.1 s): back to back, each figure was that floor (about 500 ms), not the feed's time.
Both ends stamp with the machine's wall clock (the page's Date.now(), Python's time.time()),
one clock for both processes. The vault is small (2 S memories), so the figures are the feed's.
"""

from __future__ import annotations

import secrets
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

from bench.browser import BrowserThread, ServedApp, open_bundle
from engram_sync.client import LiveStatus, Vault
from engram_sync.client._flows.live import LiveTiming
from engram_sync.client._session import VaultSession

PASSPHRASE: Final = "web vault live bench correct horse battery staple"  # noqa: S105 - bench
WAIT_S: Final = 10.0  # one memory not seen on the other side in this long: the row fails
SPACING_S: Final = LiveTiming().min_sync_gap_s + 0.1  # between two adds (module docstring)

RECORDER: Final = """() => {
  window.seenAt = {};
  new MutationObserver(() => {
    for (const li of document.querySelectorAll('#memories li')) {
      const m = /live-bench-cli-\\d+/.exec(li.textContent);
      if (m && !(m[0] in window.seenAt)) window.seenAt[m[0]] = Date.now();
    }
  }).observe(document.getElementById('memories'), { childList: true, subtree: true });
}"""
ADD: Final = """(content) => {
  document.getElementById('add-content').value = content;
  const at = Date.now();
  document.getElementById('add').requestSubmit();
  return at;
}"""


class Watcher:
    """A CLI device running `Vault.watch` in a thread; `seen(content)` waits for a memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stop = threading.Event()
        self.wake = threading.Event()
        self.connected = threading.Event()
        self._lock = threading.Lock()
        self._contents: dict[str, float] = {}
        self._changed = threading.Condition(self._lock)
        self.failure: str | None = None
        self.thread = threading.Thread(target=self._run, name="bench-web-watch", daemon=True)

    def _run(self) -> None:
        try:
            with VaultSession.open(self.path, PASSPHRASE) as session:
                vault = Vault(session)

                def on_status(status: LiveStatus) -> None:
                    if status.state == "connected" and status.mode == "events":
                        self.connected.set()

                for _ in vault.watch(
                    interval=3600, stop=self.stop, wake=self.wake, on_status=on_status
                ):
                    now = time.time()
                    with self._changed:
                        for m in vault.list():
                            self._contents.setdefault(m.content, now)
                        self._changed.notify_all()
        except Exception as exc:  # reported as the row's failure
            self.failure = f"{type(exc).__name__}: {exc}"[:200]
            self.connected.set()

    def seen(self, content: str) -> float:
        """When the device's vault first held `content` (time.time()); RuntimeError after
        WAIT_S."""
        with self._changed:
            if not self._changed.wait_for(lambda: content in self._contents, WAIT_S):
                raise RuntimeError(f"the CLI device did not get {content!r} in {WAIT_S} s")
            return self._contents[content]

    def __enter__(self) -> Watcher:
        self.thread.start()
        if not self.connected.wait(60) or self.failure:
            raise RuntimeError(f"the CLI device's watch did not connect: {self.failure}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.wake.set()
        self.thread.join(30)


def _unlock(page: Any, url: str, key: str, vault_id: str) -> None:
    open_bundle(page, url)
    page.fill("#api-key", key)
    page.fill("#vault-id", vault_id)
    page.fill("#passphrase", PASSPHRASE)
    page.click("#unlock-button")
    page.wait_for_function(
        "() => document.getElementById('live-mode').textContent === 'live updates: events'"
        " || document.getElementById('status').classList.contains('error')"
    )
    if page.inner_text("#live-mode") != "live updates: events":
        raise RuntimeError(f"the page's live feed is not up: {page.inner_text('#status')}")


def _rounds(page: Any, url: str, key: str, vault_id: str, watcher: Watcher,
            cli: Path, samples: int) -> dict[str, list[float]]:  # fmt: skip
    _unlock(page, url, key, vault_id)
    page.evaluate(RECORDER)
    to_cli: list[float] = []
    from_cli: list[float] = []
    with VaultSession.open(cli, PASSPHRASE) as session:  # the CLI's writes (this thread's)
        writer = Vault(session)
        for i in range(samples):
            time.sleep(SPACING_S)
            content = f"live-bench-web-{i}"
            added_at = page.evaluate(ADD, content)
            to_cli.append(watcher.seen(content) * 1000 - added_at)
            time.sleep(SPACING_S)
            content = f"live-bench-cli-{i}"
            started = time.time() * 1000
            writer.add(content)
            watcher.wake.set()
            page.wait_for_function(f"() => '{content}' in window.seenAt")
            from_cli.append(page.evaluate(f"() => window.seenAt['{content}']") - started)
    return {"to_cli_ms": to_cli, "from_cli_ms": from_cli}


def measure_live(relay_url: str, key: str, samples: int, browser: BrowserThread) -> dict[str, Any]:
    """The two rows (module docstring) with `samples` adds each way."""
    from engram_sync.client._web.app import build_app
    from engram_sync.client._web.bundle import bundle_dir

    vault_id = f"web-live-{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory(prefix="web-live-") as scratch:
        cli = Path(scratch) / "cli"
        with VaultSession.open(cli, PASSPHRASE, create=True) as session:
            session.link(relay_url, key, vault_id, "bench-web-live-cli")
        with (
            Watcher(cli) as watcher,
            ServedApp(build_app(bundle_dir(), relay_url, vault_id)) as web,
        ):
            rows = browser.run(
                lambda p: _rounds(p, web.url, key, vault_id, watcher, cli, samples),
                timeout=60 + samples * 2 * WAIT_S,
            )
    return {
        "samples": samples,
        "to_cli_p50_ms": statistics.median(rows["to_cli_ms"]),
        "to_cli_max_ms": max(rows["to_cli_ms"]),
        "from_cli_p50_ms": statistics.median(rows["from_cli_ms"]),
        "from_cli_max_ms": max(rows["from_cli_ms"]),
    }
