"""The test tiers (tests/tiers.py, issue 32), checked on pytest's own runs of a few tests:
a tier's tests are left out without its option and counted in the summary's last lines
(not failures); `-m` selects a tier's tests alone; and with the option given, infrastructure
that cannot be made here fails the run instead of skipping it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "tests/deploy/test_image.py"
CITUS = "tests/relay/db/test_citus.py"


def _pytest(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _last_lines(output: str, count: int) -> list[str]:
    return [line for line in output.splitlines() if line.strip()][-count:]


def test_a_tier_left_out_is_skipped_and_its_count_is_in_the_last_lines() -> None:
    result = _pytest(IMAGE, "-k", "relay_container or compose_up or mirror_is_read")
    assert result.returncode == 0, result.stdout + result.stderr
    summary, final = _last_lines(result.stdout, 2)
    assert summary == "left out: 2 tests need --docker (run: python -m pytest --docker)"
    assert "2 skipped" in final
    assert "failed" not in final
    assert "error" not in final


def test_in_two_workers_the_last_lines_count_the_same() -> None:
    """The README's command runs in two workers (`-n 2`), whose controller collects
    nothing: the count comes from the workers' skips, and equals the one-process count."""
    args = (IMAGE, CITUS, "tests/test_distribution.py", "-k", "not citus]")
    alone, two = _pytest(*args), _pytest(*args, "-n", "2")
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert two.returncode == 0, two.stdout + two.stderr
    left = [line for line in alone.stdout.splitlines() if line.startswith("left out:")]
    assert len(left) == 3
    assert [line for line in two.stdout.splitlines() if line.startswith("left out:")] == left


def test_every_tier_left_out_is_counted_once() -> None:
    result = _pytest(IMAGE, CITUS, "tests/test_distribution.py", "--collect-only")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("left out:")]
    assert [line.split(" need")[0].split()[-1] for line in lines] == ["tests"] * 3
    assert [line.split("(run: ")[1] for line in lines] == [
        "python -m pytest --citus)",
        "python -m pytest --docker)",
        "python -m pytest --wheel)",
    ]
    counts = [int(line.split()[2]) for line in lines]
    assert counts[1] == 4  # the image tests; their unit tests of the reasons stay in
    assert counts[2] == 4  # the installs; the wheel's contents stay in the default run


def test_the_marker_selects_the_tier_alone() -> None:
    result = _pytest(IMAGE, "tests/test_distribution.py", "--collect-only", "-m", "docker or wheel")
    assert result.returncode == 0, result.stdout + result.stderr
    ids = [line for line in result.stdout.splitlines() if "::" in line]
    assert len(ids) == 8, ids
    assert not any("reason" in i or "mirror" in i or "wheel_has" in i for i in ids), ids


def test_a_tier_asked_for_without_its_infrastructure_fails(tmp_path: Path) -> None:
    """Break it once: `--citus` where Citus cannot be built (no tools, an empty cache) is
    an error of the run, not a skip that would let a tier run pass by running nothing."""
    result = _pytest(
        CITUS,
        "--citus",
        "-k",
        "keeps_them_when_distributed",
        ENGRAM_CITUS_TOOLS=str(tmp_path / "no-tools"),
        ENGRAM_CITUS_CACHE=str(tmp_path / "empty-cache"),
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "--citus was given but Citus is unavailable" in result.stdout
    final = _last_lines(result.stdout, 1)[0]
    assert "1 error" in final
    assert "skipped" not in final


def test_the_docker_tier_without_its_tools_fails(tmp_path: Path) -> None:
    result = _pytest(IMAGE, "--docker", "-k", "pin", PATH=str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "--docker was given but the image tests need a Docker engine made here" in result.stdout
