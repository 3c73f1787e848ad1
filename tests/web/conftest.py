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
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeVar

import pytest

CHROMIUM: Final = Path("/usr/bin/chromium")
INSTALL_LOCK: Final = Path("/tmp/engram-sync-chromium.lock")
T = TypeVar("T")
FLAGS: Final = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip


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


class BrowserThread:
    """Playwright's sync API and the browser in a thread of their own: the sync API keeps its
    event loop marked as running in the thread that started it, which would break every
    `asyncio.run` of the session's other tests (the database fixtures, ...). Everything that
    touches the browser runs in that thread (`run`)."""

    def __init__(self, executable: Path) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chromium")
        self.pool.submit(self._start, executable).result(timeout=120)

    def _start(self, executable: Path) -> None:
        from playwright.sync_api import sync_playwright

        self.driver = sync_playwright().start()
        self.browser = self.driver.chromium.launch(
            executable_path=str(executable), args=list(FLAGS)
        )

    def _in_context(self, steps: Callable[[Any], T]) -> T:
        context = self.browser.new_context()
        context.set_default_timeout(10_000)  # a test stays short; a hang fails in 10 s
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        try:
            result = steps(page)
        finally:
            context.close()
        assert errors == [], f"errors in the page: {errors}"
        return result

    def run(self, steps: Callable[[Any], T], timeout: float = 60) -> T:
        """`steps(page)` on a fresh context's page, in the browser's thread; its result."""
        return self.pool.submit(self._in_context, steps).result(timeout=timeout)

    def close(self) -> None:
        def stop() -> None:
            self.browser.close()
            self.driver.stop()

        self.pool.submit(stop).result(timeout=30)
        self.pool.shutdown()


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


class ServedApp:
    """An ASGI app served by uvicorn on 127.0.0.1 in a daemon thread."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        from engram_sync.client._web.serve import listening_socket

        self.sock = listening_socket(0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ServedApp:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the web vault's app did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture(scope="session")
def bundle_url() -> Iterator[str]:
    """The bundle as `engram-sync web` serves it, proxying to a relay nobody listens on."""
    from engram_sync.client._web.app import build_app
    from engram_sync.client._web.bundle import bundle_dir

    with ServedApp(build_app(bundle_dir(), "http://127.0.0.1:9", "team-web")) as served:
        yield served.url


def open_bundle(page: Any, url: str) -> Any:
    """`page` at `url`, its modules loaded (app.js marks the body when it has run)."""
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", state="attached")
    return page
