"""The four rows of `bench.history` at a small size: a real relay process, three real
devices of 300 memories (two of them watching in processes of their own),
5,000 edits of 100 memories for the storage cap. It checks the harness, that the revert brings every
memory back on both watching devices, and that the history stays within its cap (never
a speed: the machine is shared)."""

from __future__ import annotations

import secrets
from pathlib import Path

from bench import history
from bench.relay_process import RelayProcess
from bench.targets import history_targets


def test_the_history_rows_at_a_small_size(fresh_database_url: str, tmp_path: Path) -> None:
    size = history.Size(
        memories=300, edit_rounds=100, pull_rounds=2, cap_memories=100, cap_edits=5_000
    )
    key = "bench-" + secrets.token_urlsafe(24)
    with RelayProcess(fresh_database_url, key, tmp_path / "relay.log") as relay:
        result = history.measure(tmp_path, relay.url, relay.key, size, log=lambda _: None)

    revert = result["revert"]
    assert (revert["pushed_first"], revert["deleted_by_a"]) == (300, 300)
    assert (revert["undeleted"], revert["unrevertible"], revert["pushed_by_revert"]) == (
        300,
        0,
        300,
    )
    assert revert["watching_devices"] == ["A", "C"]
    assert 0 < revert["revert_s"] + revert["sync_s"] <= revert["all_back_s"]

    edit = result["edit_overhead"]
    assert edit["history_rows"] == 100  # one kept version per edit with history
    assert edit["with_ms"] > 0
    assert edit["without_ms"] > 0

    pull = result["pull_overhead"]
    assert (pull["history_rows_with"], pull["history_rows_without"]) == (600, 0)

    cap = result["storage_cap"]
    assert cap["edits"] == 5_000
    assert 0 < cap["history_rows"] < 5_000  # pruned to the cap
    assert cap["capped_bytes"] == cap["capped_bytes_counted"]
    assert cap["capped_bytes"] <= cap["cap_bytes"]

    targets = {t.name: t.as_json() for t in history_targets(result)}
    assert set(targets) == {
        "history_revert_10k",
        "history_edit_overhead",
        "history_pull_overhead",
        "history_storage_cap",
    }
    assert all(t["verdict"] in ("PASS", "FAIL") for t in targets.values())
    assert targets["history_storage_cap"]["verdict"] == "PASS"
