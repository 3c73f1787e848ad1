"""The README's two-device walkthrough works as written, against a real relay."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.relay.conftest import ADMIN_KEY, Relay

ROOT = Path(__file__).resolve().parents[2]


def _walkthrough() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```sh\n# walkthrough\n(.*?)```", readme, flags=re.S)
    return block


def test_readme_walkthrough_runs_as_written(tmp_path: Path, relay: Relay) -> None:
    script = _walkthrough()
    assert "engram-relay" not in script  # the relay is already running (the fixture)
    env = dict(os.environ, HOME=str(tmp_path))
    env.pop("ENGRAM_PASSPHRASE", None)
    env.pop("ENGRAM_VAULT", None)
    prelude = f'cd "{ROOT}"\n'
    # the script's own `export RELAY=… KEY=…` line is kept; point it at this relay
    script = script.replace("http://127.0.0.1:8788", relay.url).replace(
        "en_the-admin-key-the-relay-printed", ADMIN_KEY
    )
    bin_dir = Path(sys.executable).parent
    script = script.replace(".venv/bin/", f"{bin_dir}/")
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", prelude + script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert '"content": "Deploy with make ship"' in out  # `show` on device B
    assert "Deploy with make ship-it" in out  # `list` on device A after B's edit
    assert "pending_pushes: 0" in out  # `status` on device B at the end
    assert "added 1, skipped 0 duplicate(s), 0 invalid" in out  # `import -` on device A
    exported = (tmp_path / "vault-a.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(exported) == 2  # `export`: the edited memory and the imported one
    assert "Rotate the API keys every 90 days" in out  # `search` found the imported memory
    assert (tmp_path / "vault-a" / "engrams.db").exists()
    assert (tmp_path / "vault-b" / "engrams.db").exists()


def test_cli_errors_are_one_line_and_nonzero(tmp_path: Path) -> None:
    exe = str(Path(sys.executable).parent / "engram-sync")
    env = dict(os.environ, ENGRAM_PASSPHRASE="right passphrase", HOME=str(tmp_path))
    vault = str(tmp_path / "v")
    missing = subprocess.run(
        [exe, "--vault", vault, "list"], env=env, capture_output=True, text=True, check=False
    )
    assert missing.returncode == 1
    assert "no vault at" in missing.stderr
    assert "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1

    created = subprocess.run(
        [exe, "--vault", vault, "init"], env=env, capture_output=True, text=True, check=False
    )
    assert created.returncode == 0, created.stderr
    listing = sorted(p.name for p in Path(vault).iterdir())
    wrong = subprocess.run(
        [exe, "--vault", vault, "add", "x"],
        env=dict(env, ENGRAM_PASSPHRASE="wrong passphrase"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert wrong.returncode == 2
    assert "wrong passphrase" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    assert sorted(p.name for p in Path(vault).iterdir()) == listing

    unlinked = subprocess.run(
        [exe, "--vault", vault, "sync"], env=env, capture_output=True, text=True, check=False
    )
    assert unlinked.returncode == 1
    assert "not linked to a relay" in unlinked.stderr
    debug = subprocess.run(
        [exe, "--vault", vault, "sync", "--debug"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert debug.returncode != 0
    assert "Traceback" in debug.stderr
