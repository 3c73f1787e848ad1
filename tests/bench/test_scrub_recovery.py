"""The lost-row figure of `bench.scrub_recovery` at a small size: a real relay process whose
rounds scrub every 2 s, a real device of 2,000 memories, one blob row deleted by hand. It
checks the harness and that the row comes back after the scrub and one sync (never a
speed: the machine is shared)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from bench import scrub_recovery
from bench.relay_process import RelayProcess
from bench.targets import scrub_recovery_target


def test_a_row_deleted_by_hand_is_back_after_the_scrub_and_one_sync(
    fresh_database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in scrub_recovery.relay_env(2).items():
        monkeypatch.setenv(name, value)
    key = "bench-" + secrets.token_urlsafe(24)
    with RelayProcess(fresh_database_url, key, tmp_path / "relay.log") as relay:
        result = scrub_recovery.measure(
            tmp_path, relay.url, relay.key, fresh_database_url, 2_000, 2
        )
    assert (result["memories"], result["pushed_first"], result["row_deleted"]) == (
        2_000,
        2_000,
        True,
    )
    assert result["noticed"]
    assert result["pushed_again"] == 1
    assert result["back"]
    target = scrub_recovery_target(result).as_json()
    assert target["name"] == "scrub_lost_row_back"
    assert target["verdict"] == ("PASS" if result["total_s"] <= result["limit_s"] else "FAIL")
    assert scrub_recovery.verdict(result).split(":")[0] == target["verdict"]
