"""The three rows of `bench.web_serve` at a small size (a real relay process, 20 requests, the
session's browser): it checks the harness (each figure measured, verify finding nothing, the
rows judged), never a speed: the machine is shared."""

from __future__ import annotations

import secrets
from pathlib import Path

from bench import web_serve
from bench.browser import BrowserThread
from bench.relay_process import RelayProcess
from bench.targets import web_serve_targets


def test_the_web_serve_rows_at_a_small_size(
    browser: BrowserThread, fresh_database_url: str, tmp_path: Path
) -> None:
    key = "bench-" + secrets.token_urlsafe(24)
    with RelayProcess(fresh_database_url, key, tmp_path / "relay.log") as relay:
        result = web_serve.measure(relay.url, lambda _: None, quick=True, browser=browser)
    served, verify, page = result["served"], result["verify"], result["page"]
    assert served["requests"] == web_serve.QUICK_REQUESTS
    assert min(served["health_p50_ms"], served["page_p50_ms"]) > 0
    assert verify["findings"] == 0
    assert verify["files"] >= 15
    assert min(page["relay_median_ms"], page["local_median_ms"]) > 0
    targets = {t.name: t.as_json() for t in web_serve_targets(result)}
    assert set(targets) == {"web_vault_served_vs_health", "web_verify_s", "web_vault_page_ms"}
    assert all(t["verdict"] in ("PASS", "FAIL") for t in targets.values())
