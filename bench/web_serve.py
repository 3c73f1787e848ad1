"""The relay-served web vault's figures (issue 34 slice 3; docs/web-vault.md "Served by the
relay"), three rows of one run, each with its PASS/FAIL (bench.targets.web_serve_targets):

1. `web_vault_served_vs_health`: the relay's page at /vault/ (index.html with its SRI and
   import map, from the bundle cache) served p50 over the p50 of `/health` (the cheapest
   route), the same client and connection, interleaved: a ratio, so the machine's load
   cancels out. Target <= 3.
2. `web_verify_s`: `engram-sync web verify`'s work (the manifest, every file, the page,
   compared with the installed bundle) against the relay, median of R runs; it must find
   nothing. Target <= 2 s.
3. `web_vault_page_ms`: in Chromium, milliseconds from navigation to the page's modules run
   (every module checked against the import map's SRI) at the relay's /vault/, median of R
   loads; the same at `engram-sync web`'s app in the detail. Target <= 1,000 ms.

The limits are this slice's own (the issue names no figure for the relay's copy).
`python -m bench.web_serve [--quick]` runs them alone on an embedded PostgreSQL and a relay
process of their own; `python -m bench` runs them on its relay.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any, Final

import httpx

from bench.browser import CHROMIUM, BrowserThread, ServedApp, open_bundle

Log = Callable[[str], None]
REQUESTS: Final = 300
QUICK_REQUESTS: Final = 40
RUNS: Final = 5
READY_MS: Final = "() => performance.now()"


def _p50_ms(client: httpx.Client, paths: tuple[str, ...], count: int) -> dict[str, float]:
    """The p50 of each path in milliseconds, the paths interleaved `count` times."""
    times: dict[str, list[float]] = {path: [] for path in paths}
    for _ in range(count):
        for path in paths:
            started = time.perf_counter()
            answer = client.get(path)
            times[path].append((time.perf_counter() - started) * 1000)
            if answer.status_code != 200:
                raise RuntimeError(f"{path} answered {answer.status_code}")
    return {path: statistics.median(values) for path, values in times.items()}


def served(relay_url: str, count: int) -> dict[str, Any]:
    """Row 1: /vault/ and /vault/js/app.js against /health."""
    with httpx.Client(base_url=relay_url, timeout=10) as client:
        client.get("/vault/")  # the bundle read once into the cache
        p50 = _p50_ms(client, ("/health", "/vault/", "/vault/js/app.js"), count)
    return {
        "requests": count,
        "health_p50_ms": p50["/health"],
        "page_p50_ms": p50["/vault/"],
        "module_p50_ms": p50["/vault/js/app.js"],
        "ratio": p50["/vault/"] / p50["/health"],
    }


def verify(relay_url: str, runs: int) -> dict[str, Any]:
    """Row 2: verify's fetch and comparison, as the command does them."""
    from engram_sync.client._web.bundle import bundle_dir
    from engram_sync.client._web.verify import findings, vault_url
    from engram_sync.client._web.verify_fetch import fetch
    from engram_sync.shared_format.web_bundle import bundle_from_folder

    seconds, found = [], 0
    for _ in range(runs):
        started = time.perf_counter()
        local = bundle_from_folder(bundle_dir())
        found = len(findings(local, fetch(vault_url(relay_url), local.files)))
        seconds.append(time.perf_counter() - started)
    return {"runs": runs, "median_s": statistics.median(seconds), "max_s": max(seconds),
            "findings": found, "files": len(local.files)}  # fmt: skip


def _ready_ms(browser: BrowserThread, url: str, runs: int) -> list[float]:
    def load(page: Any) -> float:
        open_bundle(page, url)
        value: float = page.evaluate(READY_MS)
        return value

    return [browser.run(load) for _ in range(runs)]


def page(relay_url: str, runs: int, browser: BrowserThread | None) -> dict[str, Any]:
    """Row 3, in `browser` (else one of its own); `{"skipped": reason}` without Chromium."""
    if not CHROMIUM.exists():
        return {"skipped": f"no Chromium at {CHROMIUM} (apt-get install chromium)"}
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return {"skipped": "playwright is not installed (pip install -e '.[test]')"}
    from engram_sync.client._web.app import build_app
    from engram_sync.client._web.bundle import bundle_dir

    own = browser is None
    browser = browser or BrowserThread()
    try:
        relay_ms = _ready_ms(browser, f"{relay_url}/vault/", runs)
        with ServedApp(build_app(bundle_dir(), relay_url, None)) as web:
            local_ms = _ready_ms(browser, web.url, runs)
    finally:
        if own:
            browser.close()
    return {"runs": runs, "relay_median_ms": statistics.median(relay_ms),
            "local_median_ms": statistics.median(local_ms)}  # fmt: skip


def measure(
    relay_url: str, log: Log, *, quick: bool = False, browser: BrowserThread | None = None
) -> dict[str, Any]:
    """The three rows (module docstring)."""
    count = QUICK_REQUESTS if quick else REQUESTS
    log(f"web serve: /vault/ and /health, {count} requests each")
    result: dict[str, Any] = {"served": served(relay_url, count)}
    log(f"web serve: web verify x{RUNS}")
    result["verify"] = verify(relay_url, RUNS)
    log(f"web serve: the page at /vault/ in Chromium x{RUNS}")
    result["page"] = page(relay_url, RUNS, browser)
    result["load_average"] = os.getloadavg()
    return result


def main(argv: list[str] | None = None) -> int:
    """The three rows alone, on their own embedded PostgreSQL and relay process."""
    from bench.alone import run_alone
    from bench.targets import web_serve_targets

    parser = argparse.ArgumentParser(prog="python -m bench.web_serve")
    parser.add_argument("--quick", action="store_true", help="fewer requests: seconds")
    args = parser.parse_args(argv)
    return run_alone(
        lambda scratch, url, key, log: measure(url, log, quick=args.quick), web_serve_targets
    )


if __name__ == "__main__":
    raise SystemExit(main())
