"""Which tests get a `[citus]` case (tests/conftest.py, issue 18): those of the modules
marked `both_databases`, collected always and run with `--citus` (skipped as left out
without it, tests/tiers.py); with `--citus-all` every database test. Checked on pytest's own
collection of two modules: one marked (tests/relay/http/test_pull.py) and one not
(tests/relay/http/test_devices.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MARKED, UNMARKED = "tests/relay/http/test_pull.py", "tests/relay/http/test_devices.py"
MODULES = (MARKED, UNMARKED)


def _collected(*options: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
         *options, *MODULES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


def _cases(ids: list[str], module: str, backend: str) -> list[str]:
    return [i for i in ids if i.startswith(module) and f"[{backend}" in i]


@pytest.mark.parametrize(
    ("options", "marked", "unmarked"),
    [((), True, False), (("--citus",), True, False), (("--citus-all",), True, True)],
    ids=["default", "citus", "all"],
)
def test_the_citus_case_goes_where_the_mode_says(
    options: tuple[str, ...], marked: bool, unmarked: bool
) -> None:
    ids = _collected(*options)
    for module, expected in ((MARKED, marked), (UNMARKED, unmarked)):
        on_citus, on_postgres = _cases(ids, module, "citus"), _cases(ids, module, "postgres")
        assert bool(on_citus) == expected, (module, options)
        # the same tests on both: each [citus] case has its [postgres] twin
        assert sorted(i.replace("[citus", "[postgres") for i in on_citus) == sorted(on_postgres)


def test_the_citus_cases_are_the_citus_tier() -> None:
    """`-m citus` selects the `[citus]` cases alone (`.ci/run`'s tier run)."""
    ids = _collected("-m", "citus")
    assert ids
    assert all("[citus" in i for i in ids), [i for i in ids if "[citus" not in i][:3]
    assert ids == _cases(_collected(), MARKED, "citus")
