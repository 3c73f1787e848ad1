"""Debian's Chromium driven by Playwright, and an ASGI app served in a thread: what the web
vault's tests (tests/web) and its bench rows (bench.web_vault) share.

Playwright's sync API and the browser live in a thread of their own (`BrowserThread.run`): the
sync API keeps its event loop marked as running in the thread that started it, which would break
every `asyncio.run` of that thread afterwards (database fixtures, the relay's tools)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeVar

T = TypeVar("T")
CHROMIUM: Final = Path("/usr/bin/chromium")
FLAGS: Final = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip


class BrowserThread:
    """One Chromium; `run(steps)` calls `steps(page)` on a fresh context in its thread."""

    def __init__(self, executable: Path = CHROMIUM) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chromium")
        self.pool.submit(self._start, executable).result(timeout=120)

    def _start(self, executable: Path) -> None:
        from playwright.sync_api import sync_playwright

        self.driver = sync_playwright().start()
        self.browser = self.driver.chromium.launch(
            executable_path=str(executable), args=list(FLAGS)
        )

    def _in_context(self, steps: Callable[[Any], T], timeout_ms: float) -> T:
        context = self.browser.new_context()
        context.set_default_timeout(timeout_ms)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        try:
            result = steps(page)
        finally:
            context.close()
        if errors:
            raise AssertionError(f"errors in the page: {errors}")
        return result

    def run(self, steps: Callable[[Any], T], timeout: float = 60, step_ms: float = 10_000) -> T:
        """`steps(page)`'s result; each Playwright wait fails after `step_ms`."""
        return self.pool.submit(self._in_context, steps, step_ms).result(timeout=timeout)

    def close(self) -> None:
        def stop() -> None:
            self.browser.close()
            self.driver.stop()

        self.pool.submit(stop).result(timeout=30)
        self.pool.shutdown()


class ServedApp:
    """An ASGI app served by uvicorn on 127.0.0.1 (a free port) in a daemon thread."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        from engram_sync.client._web.serve import listening_socket

        self.sock = listening_socket(0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        # a page's live feed holds a stream open through the app: without a bound on the
        # graceful shutdown, stopping waited for `__exit__`'s 10 s join on every such test
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                                    timeout_graceful_shutdown=1))  # fmt: skip
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ServedApp:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the app did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def open_bundle(page: Any, url: str) -> Any:
    """`page` at `url`, its modules loaded (app.js marks the body when it has run)."""
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", state="attached")
    return page
