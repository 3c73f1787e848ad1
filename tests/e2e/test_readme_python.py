"""The README's "Use from Python" example runs as written, against a real relay."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from engram_sync.client import Vault
from tests.relay.conftest import ADMIN_KEY, Relay

ROOT = Path(__file__).resolve().parents[2]
PASSPHRASE = "a long passphrase both devices share"


def _example() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n# use from python\n(.*?)```", readme, flags=re.S)
    return block


def test_the_python_example_runs_as_written(tmp_path: Path, relay: Relay) -> None:
    script = _example()
    assert "from engram_sync.client import" in script  # only the public API
    assert "._" not in script  # no private module or attribute
    env = dict(os.environ, HOME=str(tmp_path), RELAY=relay.url, KEY=ADMIN_KEY)
    env["ENGRAM_PASSPHRASE"] = PASSPHRASE
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=tmp_path,  # not the checkout: the installed package
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "1 memory arrived",
        "True Deploy with make ship ['ops']",
    ]
    # the edit made on the second device reaches the first
    with Vault.open(tmp_path / "tool-vault-a", PASSPHRASE) as laptop:
        assert laptop.sync().applied == 1
        assert [m.content for m in laptop.list()] == ["Deploy with make ship-it"]


def test_the_python_example_says_so_when_the_relay_is_down(tmp_path: Path) -> None:
    env = dict(os.environ, HOME=str(tmp_path), RELAY="http://127.0.0.1:9", KEY=ADMIN_KEY)
    env["ENGRAM_PASSPHRASE"] = PASSPHRASE
    result = subprocess.run(
        [sys.executable, "-c", _example()],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # the first device's link cannot reach the relay: a typed error, nothing half-written
    assert result.returncode == 1
    assert "RelayUnavailableError" in result.stderr
    with Vault.open(tmp_path / "tool-vault-a", PASSPHRASE) as laptop:
        assert laptop.list() == []
        assert laptop.vault_id is None
