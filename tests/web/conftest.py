"""The browser of the web vault's tests (docs/web-vault.md "Tests"): Debian's Chromium driven by
Playwright through `executable_path` (Playwright's own browser download is not reachable).

`chromium_path` is /usr/bin/chromium, else the `chromium` package installed with apt-get when
running as root (about 2 minutes, under a file lock so parallel sessions install it once), else
the tests are skipped with the reason. One browser per session (`browser`), in a thread of
its own; each `browser.run(steps)` gets a fresh context. `bundle_url` serves the installed
bundle with `engram-sync web`'s app (client/_web/app.py) in a thread, for tests that need no
relay."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from bench.browser import CHROMIUM, BrowserThread, ServedApp, open_bundle

__all__ = ["BrowserThread", "ServedApp", "open_bundle"]

INSTALL_LOCK: Final = Path("/tmp/engram-sync-chromium.lock")


def _apt_install() -> str | None:
    """Install Debian's chromium; None when done, else the reason it could not be."""
    if os.geteuid() != 0:
        return "Chromium is not installed and installing it needs root (apt-get install chromium)"
    if shutil.which("apt-get") is None:
        return "Chromium is not installed and there is no apt-get to install it"
    with INSTALL_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be installing it
        if CHROMIUM.exists():
            return None
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for command in (["apt-get", "install", "-y", "chromium"], ["apt-get", "update"],
                        ["apt-get", "install", "-y", "chromium"]):  # fmt: skip
            done = subprocess.run(command, env=env, capture_output=True, timeout=900, check=False)
            if done.returncode == 0 and command[1] == "install":
                return None
    return None if CHROMIUM.exists() else "apt-get could not install chromium"


@pytest.fixture(scope="session")
def chromium_path() -> Path:
    if not CHROMIUM.exists():
        reason = _apt_install()
        if reason is not None:
            pytest.skip(reason)
    return CHROMIUM


@pytest.fixture(scope="session")
def browser(chromium_path: Path) -> Iterator[BrowserThread]:
    """The session's one browser."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed (the test extra)")
    thread = BrowserThread(chromium_path)
    try:
        yield thread
    finally:
        thread.close()


@pytest.fixture(scope="session")
def bundle_url() -> Iterator[str]:
    """The bundle as `engram-sync web` serves it, proxying to a relay nobody listens on."""
    from engram_sync.client._web.app import build_app
    from engram_sync.client._web.bundle import bundle_dir

    with ServedApp(build_app(bundle_dir(), "http://127.0.0.1:9", "team-web")) as served:
        yield served.url
