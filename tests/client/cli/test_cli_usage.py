"""`engram-sync` as a newcomer types it (issue 32, "What a new user hit"): a bare command or
group prints its help once, and `--debug` leaves a usage error a usage error (exit 2, one
line, no traceback) while still showing the traceback of a real error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXE = Path(sys.executable).parent / "engram-sync"


def run(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="100", HOME=str(home), ENGRAM_PASSPHRASE="x")
    env.pop("ENGRAM_VAULT", None)
    return subprocess.run(
        [str(EXE), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("args", "usage"),
    [
        ((), "Usage: engram-sync [OPTIONS] COMMAND"),
        (("team",), "Usage: engram-sync team [OPTIONS] COMMAND"),
        (("--debug",), "Usage: engram-sync [OPTIONS] COMMAND"),
    ],
)
def test_a_bare_command_prints_its_help_once(
    args: tuple[str, ...], usage: str, tmp_path: Path
) -> None:
    result = run(*args, home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("Usage:") == 1, result.stdout
    assert usage in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--debug", "list", "--bogus"), "No such option: --bogus"),
        (("list", "--bogus", "--debug"), "No such option: --bogus"),
        (("--debug", "nosuchcommand"), "No such command 'nosuchcommand'"),
        (("--debug", "add"), "Missing argument 'TEXT'"),
    ],
)
def test_debug_keeps_a_usage_error_at_exit_2(
    args: tuple[str, ...], words: str, tmp_path: Path
) -> None:
    result = run(*args, home=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert words in lines[0]
    assert "Traceback" not in result.stderr


def test_debug_still_shows_a_real_errors_traceback(tmp_path: Path) -> None:
    result = run("--debug", "--vault", str(tmp_path / "none"), "list", home=tmp_path)
    assert result.returncode == 1
    assert "Traceback" in result.stderr
    assert "no vault at" in result.stderr
