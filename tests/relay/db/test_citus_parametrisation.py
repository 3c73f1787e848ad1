"""Which tests get a `[citus]` case (tests/conftest.py, issue 18): by default those of the
modules marked `both_databases`, with ENGRAM_CITUS=1 every database test, with
ENGRAM_CITUS=0 none. Checked on pytest's own collection of two modules: one marked
(tests/relay/test_pull.py) and one not (tests/relay/test_devices.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MARKED, UNMARKED = "tests/relay/test_pull.py", "tests/relay/test_devices.py"
MODULES = (MARKED, UNMARKED)


def _collected(citus: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "ENGRAM_CITUS"}
    if citus is not None:
        env["ENGRAM_CITUS"] = citus
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "-q",
            *MODULES,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


def _cases(ids: list[str], module: str, backend: str) -> list[str]:
    return [i for i in ids if i.startswith(module) and f"[{backend}" in i]


@pytest.mark.parametrize(
    ("citus", "marked", "unmarked"),
    [(None, True, False), ("1", True, True), ("0", False, False)],
    ids=["default", "all", "off"],
)
def test_the_citus_case_goes_where_the_mode_says(
    citus: str | None, marked: bool, unmarked: bool
) -> None:
    ids = _collected(citus)
    for module, expected in ((MARKED, marked), (UNMARKED, unmarked)):
        on_citus, on_postgres = _cases(ids, module, "citus"), _cases(ids, module, "postgres")
        assert bool(on_citus) == expected, (module, citus)
        # the same tests on both: each [citus] case has its [postgres] twin
        assert sorted(i.replace("[citus", "[postgres") for i in on_citus) == sorted(on_postgres)
    plain = [i for i in ids if i.startswith(MARKED) and "[" not in i]
    assert bool(plain) == (citus == "0"), plain[:3]  # off: the ids of before, unparametrised
