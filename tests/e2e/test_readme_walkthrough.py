"""The README's two-device walkthrough works as written, against a real relay."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.relay.conftest import ADMIN_KEY, Relay

ROOT = Path(__file__).resolve().parents[2]


def _block(page: str, first_line: str) -> str:
    text = (ROOT / page).read_text(encoding="utf-8")
    (block,) = re.findall(rf"```sh\n{re.escape(first_line)}\n(.*?)```", text, flags=re.S)
    return block


def _walkthrough() -> str:
    return _block("README.md", "# walkthrough")


def _run_as_written(script: str, relay: Relay, home: Path, **env_vars: str) -> str:
    """`script` in bash with the checkout as the working directory, pointed at `relay`, with
    `.venv/bin/` meaning this test's interpreter's bin; its stdout."""
    env = dict(os.environ, HOME=str(home), **env_vars)
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
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_readme_walkthrough_runs_as_written(tmp_path: Path, relay: Relay) -> None:
    script = _walkthrough()
    assert "engram-relay" not in script  # the relay is already running (the fixture)
    out = _run_as_written(script, relay, tmp_path)
    assert '"content": "Deploy with make ship"' in out  # `show` on device B
    assert "Deploy with make ship-it" in out  # `list` on device A after B's edit
    assert "pending_pushes: 0" in out  # `status` on device B at the end
    assert "added 1, skipped 0 duplicate(s), 0 invalid" in out  # `import -` on device A
    exported = (tmp_path / "vault-a.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(exported) == 2  # `export`: the edited memory and the imported one
    assert "Rotate the API keys every 90 days" in out  # `search` found the imported memory
    assert (tmp_path / "vault-a" / "engrams.db").exists()
    assert (tmp_path / "vault-b" / "engrams.db").exists()


def test_the_accounts_commands_run_after_the_walkthrough(tmp_path: Path, relay: Relay) -> None:
    """docs/accounts-and-teams.md's first block, in the walkthrough's shell, as written
    (issue 32: it used bare `engram-sync`, device A without `--vault`, and `init` of a
    vault the walkthrough had made)."""
    accounts = _block("docs/accounts-and-teams.md", "# accounts after the walkthrough")
    assert "engram-sync --vault ~/vault-b init" not in accounts  # the walkthrough made it
    for line in accounts.splitlines():
        if "engram-sync" in line and not line.startswith("#"):
            assert ".venv/bin/engram-sync --vault ~/" in line, line
    out = _run_as_written(
        _walkthrough() + accounts,
        relay,
        tmp_path,
        ENGRAM_EMAIL="reader@example.org",
        ENGRAM_ACCOUNT_PASSWORD="a long account password for the docs",
    )
    assert len(re.findall(r"^ +(?:[a-z]+ ){11}[a-z]+$", out, flags=re.M)) == 1  # the phrase
    assert "Rotate the API keys every 90 days" in out.split("linked to", 1)[1]  # C's list
    assert (tmp_path / "vault-c" / "engrams.db").exists()


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
