"""`engram-relay` as a newcomer types it (issue 32, "What a new user hit"): a bare command
or group prints its help once, and `--debug` leaves a usage error a usage error (exit 2,
one line, no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXE = Path(sys.executable).parent / "engram-relay"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="100")
    return subprocess.run(
        [str(EXE), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("args", "usage"),
    [
        ((), "Usage: engram-relay [OPTIONS] COMMAND"),
        (("keys",), "Usage: engram-relay keys [OPTIONS] COMMAND"),
        (("--debug", "vaults"), "Usage: engram-relay vaults [OPTIONS] COMMAND"),
    ],
)
def test_a_bare_command_prints_its_help_once(args: tuple[str, ...], usage: str) -> None:
    result = run(*args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("Usage:") == 1, result.stdout
    assert usage in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--debug", "--nope"), "No such option: --nope"),
        (("keys", "--nope", "--debug"), "No such option: --nope"),
        (("--debug", "serve", "--port", "abc"), "Invalid value for '--port'"),
    ],
)
def test_debug_keeps_a_usage_error_at_exit_2(args: tuple[str, ...], words: str) -> None:
    result = run(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert words in lines[0]
    assert "Traceback" not in result.stderr
