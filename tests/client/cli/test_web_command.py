"""`engram-sync web`'s refusals (client/_cli/web_command.py): one line and exit 1 when there is
no vault or the vault is not linked to a relay, before anything is served."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from engram_sync.client._session import VaultSession

EXE = str(Path(sys.executable).parent / "engram-sync")


def _web(vault: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOME=str(vault.parent), COLUMNS="200")
    return subprocess.run(
        [EXE, "--vault", str(vault), "web", "--no-open"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_no_vault_and_an_unlinked_vault_are_refused_in_one_line(tmp_path: Path) -> None:
    missing = _web(tmp_path / "nowhere")
    assert missing.returncode == 1
    assert "no vault at" in missing.stderr
    assert missing.stdout == ""
    with VaultSession.open(tmp_path / "vault", "cli web correct horse battery", create=True):
        pass
    unlinked = _web(tmp_path / "vault")
    assert unlinked.returncode == 1
    assert "not linked to a relay" in unlinked.stderr
    assert len(unlinked.stderr.strip().splitlines()) == 1
