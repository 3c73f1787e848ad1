"""`python -m bench --citus --quick` (issue 18, bench.citus_compare) runs end to end.

The harness only: every figure of the Citus and the plain PostgreSQL side is a number,
every target has a verdict, the Markdown has its tables. It never asserts a speed or a
verdict (the machine is shared). The `citus` tier (`--citus`, tests/tiers.py).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engram_sync.relay.db.citus import DISTRIBUTED_TABLES
from tests import tiers
from tests.citus_cluster import CitusUnavailableError, ensure_citus_build

ROOT = Path(__file__).resolve().parents[2]
SIDE_FIGURES = ("push_blobs_per_s", "pull_blobs_per_s", "incremental_pull_small_ms",
                "incremental_pull_large_ms")  # fmt: skip
TARGETS = {
    "citus_push_time_ratio",
    "citus_pull_time_ratio",
    "plain_incremental_pull_flat",
    "citus_incremental_pull_flat",
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@pytest.fixture(scope="module")
@tiers.needs("citus")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    tiers.require("citus")
    try:
        ensure_citus_build(Path(sys.executable))
    except CitusUnavailableError as exc:
        tiers.unavailable("citus", f"Citus cannot be built here: {exc}")
    out = tmp_path_factory.mktemp("bench-citus")
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--citus", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    [json_path] = out.glob("*.json")
    assert json_path.name.endswith("-citus-quick.json")
    return json.loads(json_path.read_text(encoding="utf-8")), json_path


@pytest.mark.timeout(960)
def test_every_citus_figure_is_a_number(report: tuple[dict[str, Any], Path]) -> None:
    data, _ = report
    citus = data["sections"]["citus"]
    assert citus["available"] is True
    for side in ("plain", "citus"):
        for name in SIDE_FIGURES:
            figure = citus[side][name]
            assert all(_is_number(figure[k]) for k in ("min", "median", "max")), (side, name)
            assert figure["min"] <= figure["median"] <= figure["max"], (side, name)
        assert _is_number(citus[side]["incremental_pull_large_to_small"]), side
        points = citus[side]["push_groups"]["points"]
        assert [p["vaults"] for p in points] == [1, 8, 32, 128], side
        assert all(_is_number(p["push_group_ms"]) and p["push_group_ms"] > 0 for p in points)
    ratio = citus["citus_to_plain"]
    for key in ("push_time", "pull_time", "incremental_pull_small"):
        assert _is_number(ratio[key]), key
        assert ratio[key] > 0, key
    assert [p["vaults"] for p in ratio["push_group"]] == [1, 8, 32, 128]
    assert citus["large_vault_blobs"] > citus["small_vault_blobs"]
    assert "." in citus["versions"]["citus"]  # the extension's version, from the coordinator
    # what was measured is the relay's schema placed on Citus (relay/db/citus.py)
    assert citus["distributed_tables"] == len(DISTRIBUTED_TABLES)


@pytest.mark.timeout(960)
def test_every_citus_target_has_a_verdict(report: tuple[dict[str, Any], Path]) -> None:
    data, json_path = report
    assert {t["name"] for t in data["targets"]} == TARGETS
    for target in data["targets"]:
        assert target["verdict"] in {"PASS", "FAIL"}, target
        assert _is_number(target["value"]), target
    markdown = json_path.with_suffix(".md").read_text(encoding="utf-8")
    assert markdown.count("**PASS**") + markdown.count("**FAIL**") == len(TARGETS)
    for heading in ("## Environment", "## Targets", "## Figures", "## Method"):
        assert heading in markdown
    assert "Citus: push group of 128 vaults" in markdown
