"""The rows of `bench.web_vault` at a small size (a real relay process, 20 and 300
memories, 3 searches): it checks the harness (every phase timed, every memory listed, the
rows judged), never a speed: the machine is shared. Here rather than in tests/bench so it runs
in the session's one browser (tests/web/conftest.py)."""

from __future__ import annotations

import secrets
from pathlib import Path

from bench import web_vault
from bench.browser import BrowserThread
from bench.relay_process import RelayProcess
from bench.targets import web_vault_targets


def test_the_web_vault_rows_at_a_small_size(
    browser: BrowserThread, fresh_database_url: str, tmp_path: Path
) -> None:
    key = "bench-" + secrets.token_urlsafe(24)
    size = web_vault.Size(unlock_memories=20, memories=300, searches=3, live=1)
    with RelayProcess(fresh_database_url, key, tmp_path / "relay.log") as relay:
        result = web_vault.measure(relay.url, relay.key, size, lambda _: None, browser)

    unlock, pull, search = result["unlock"], result["pull"], result["search"]
    assert (unlock["memories"], pull["memories"], search["searches"]) == (20, 300, 3)
    assert 0 < unlock["keys_s"] < unlock["unlock_s"]
    assert 0 < pull["pulled_s"] <= pull["pull_s"]
    assert 0 <= search["median_ms"] <= search["max_ms"]
    targets = {t.name: t.as_json() for t in web_vault_targets(result)}
    assert set(targets) == {
        "web_unlock", "web_pull_10k", "web_search_10k", "web_passkey_unlock",
        "web_passkey_vault_unlock", "web_live_to_cli", "web_live_from_cli",
    }  # fmt: skip
    passkey = result["passkey"]
    assert passkey["memories"] == 20
    assert 0 < passkey["after_gesture_s"] < passkey["with_gesture_s"]
    by_vault = result["passkey_vault"]
    assert by_vault["memories"] == 20
    assert 0 < by_vault["after_gesture_s"] < by_vault["with_gesture_s"]
    assert result["live"]["samples"] == 1
    assert 0 < result["live"]["to_cli_p50_ms"] <= result["live"]["to_cli_max_ms"]
    assert 0 < result["live"]["from_cli_p50_ms"] <= result["live"]["from_cli_max_ms"]
    assert all(t["verdict"] in ("PASS", "FAIL") for t in targets.values())


def test_no_row_without_a_browser() -> None:
    assert web_vault_targets({"skipped": "no Chromium"}) == []
