"""`python -m bench --quick` runs end to end and writes a complete report.

This checks the harness only: every section is there with numbers, every target has
a verdict, the Markdown exists. It never asserts a speed (the machine is shared).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.browser import CHROMIUM

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = (
    "ceiling",
    "relay_push",
    "relay_pull",
    "sweep",
    "pull_vs_size",
    "latency",
    "client_e2e",
    "relay_memory",
    "cpu",
    "pull_memory",
    "digest",
    "jsonl_import",
    "rekey",
    "live_feed",
    "live_latency",
    "live_throughput",
    "agent",
    "stream_hog",
    "history",
    "mcp",
    "raw_latency",  # issue 36
    "relay_idle",
    *(("web_vault",) if CHROMIUM.exists() else ()),  # issue 34: needs Chromium (bench.web_vault)
    "client_sizes",
    "agent_reads",
)
TARGETS = {
    "relay_push_vs_ceiling",
    "relay_pull_vs_ceiling",
    "pull_cost_vs_vault_size",
    "push_p99_shared_vault",
    "push_p99_vault_per_device",
    "push_p99_vs_raw_vault_per_device",  # issue 36
    "push_p99_vs_raw_shared_vault",
    "relay_idle_rss",
    "relay_rss_concurrent_full_pulls",
    "padding_storage_overhead",
    "digest_find_round_trips",
    "digest_find_bytes",
    "digest_push_overhead",
    "digest_scan_fairness",
    "jsonl_import_rate",
    "rekey_seconds",
    "rekey_write_refused",
    "live_feed_idle_rss",
    "live_feed_idle_queries",
    "live_feed_wake_p50",
    "live_feed_wake_p99",
    "live_sync_applied_p50",
    "live_sync_applied_p99",
    "live_feed_push_overhead",
    "live_feed_push_vs_ceiling",
    "agent_command_ms",
    "stream_hog_device_failures",
    "history_revert_10k",
    "history_edit_overhead",
    "history_pull_overhead",
    "history_storage_cap",
    "mcp_remember_to_recall_p50",
    "mcp_remember_to_recall_p99",
    "mcp_recall_100k",
    "mcp_remember_throughput",
    "one_memory_vs_api_small",  # issue 36 (bench.client_e2e.measure_sizes)
    "one_memory_vs_api_large",
    "one_memory_cost_large_vs_small",
    "client_push_vs_api",
    "client_pull_apply_vs_api",
    "agent_search_page_ms",  # issue 36 (bench.agent_reads)
    "agent_list_json_ms",
    "agent_search_all_json_ms",
    "web_vault_served_vs_health",  # issue 34 slice 3 (bench.web_serve)
    "web_verify_s",
} | (
    {
        "web_unlock",
        "web_pull_10k",
        "web_search_10k",
        "web_vault_page_ms",
        "web_passkey_unlock",
        "web_passkey_vault_unlock",
        "web_live_to_cli",
        "web_live_from_cli",
    }
    if CHROMIUM.exists()
    else set()
)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _numbers(value: Any) -> list[float]:
    if _is_number(value):
        return [value]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return []


def _summaries(value: Any) -> list[dict[str, Any]]:
    """Every {"min", "median", "max", ...} figure inside `value`."""
    found: list[dict[str, Any]] = []
    if isinstance(value, dict):
        if {"min", "median", "max"} <= value.keys():
            found.append(value)
        for v in value.values():
            found += _summaries(v)
    elif isinstance(value, list):
        for v in value:
            found += _summaries(v)
    return found


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("bench")
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=480,  # about 100 s quiet; the margin is for a loaded machine
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    [json_path] = out.glob("*.json")
    assert json_path.name.endswith("-quick.json")
    return json.loads(json_path.read_text(encoding="utf-8")), json_path


@pytest.mark.timeout(540)
def test_every_section_has_numbers(report: tuple[dict[str, Any], Path]) -> None:
    data, _ = report
    sections = data["sections"]
    for name in SECTIONS:
        assert _numbers(sections[name]), f"section {name} has no numeric value"
    for figure in _summaries(sections):
        assert all(_is_number(figure[k]) for k in ("min", "median", "max")), figure
        assert figure["min"] <= figure["median"] <= figure["max"], figure
    assert _is_number(sections["relay_push"]["ratio_to_ceiling"])
    assert _is_number(sections["relay_pull"]["ratio_to_ceiling"])
    assert _is_number(sections["pull_vs_size"]["ratio_large_to_small"])
    for mode in ("single_device", "shared_vault", "vault_per_device"):
        for key in ("p50_ms", "p99_ms", "errors"):
            assert _is_number(sections["latency"][mode][key]["median"]), (mode, key)
    memory = sections["relay_memory"]
    assert all(_is_number(memory[k]) for k in ("rss_start_mb", "rss_peak_mb", "rss_end_mb"))
    assert memory["samples"]
    for phase in sections["cpu"].values():
        assert _is_number(phase["relay_cpu_s"])
        assert _is_number(phase["loadgen_cpu_s"])
    profile = sections["client_e2e"]["profile"]
    for side in ("push", "pull"):
        assert 0 < len(profile[f"{side}_top_cumulative"]) <= 15
    assert 0 < data["corpus"]["padding_overhead"] < 0.125  # PADMÉ's bound from L = 16 on
    assert sections["digest"]["found"] is True  # the divergent memory was named (§18)
    assert sections["peer"]["available"] is False
    assert "not available" in sections["peer"]["note"]


def test_every_target_has_a_verdict(report: tuple[dict[str, Any], Path]) -> None:
    data, json_path = report
    assert {t["name"] for t in data["targets"]} == TARGETS
    for target in data["targets"]:
        assert target["verdict"] in {"PASS", "FAIL"}, target
        assert _is_number(target["value"]), target
        assert "load " in target["detail"], target  # issue 36: every row with its load
    markdown = json_path.with_suffix(".md").read_text(encoding="utf-8")
    assert markdown.count("**PASS**") + markdown.count("**FAIL**") == len(TARGETS)


def test_environment_and_outputs(report: tuple[dict[str, Any], Path]) -> None:
    data, json_path = report
    env = data["environment"]
    for key in ("cpu_model", "cores", "python", "postgresql", "git_sha", "git_dirty"):
        assert key in env, key
    assert data["settings"]["quick"] is True
    markdown = json_path.with_suffix(".md").read_text(encoding="utf-8")
    for heading in ("## Environment", "## Targets", "## Figures", "## CPU by phase"):
        assert heading in markdown
    if data["plots"]:
        assert all((json_path.parent / name).is_file() for name in data["plots"])
    else:
        assert "matplotlib" in data["plot_note"]  # skipped, and the report says why
