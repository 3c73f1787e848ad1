"""`engram-sync rekey` judges the new passphrase as `init` does (issue 17 "Polish", zxcvbn):
a weak one is refused without a terminal unless --force, before anything moves."""

from __future__ import annotations

import json
from pathlib import Path

from engram_sync.shared_format.sync_keys import vault_id_v2
from tests.e2e.test_rekey_cli import OLD, _cli, _fill, _retired
from tests.relay.conftest import Relay

WEAK = "abc12345"


def test_a_weak_new_passphrase_is_refused_and_nothing_moves(tmp_path: Path, relay: Relay) -> None:
    alpha, old_id = _fill(tmp_path, relay)

    refused = _cli(alpha, "rekey", home=tmp_path, ENGRAM_NEW_PASSPHRASE=WEAK)

    assert refused.returncode == 1, refused.stderr
    assert "the passphrase is weak: strength" in refused.stderr
    assert "refused a weak passphrase" in refused.stderr
    assert "--force" in refused.stderr
    assert WEAK not in refused.stderr  # the estimate is shown, never the passphrase
    assert "Traceback" not in refused.stderr
    assert not _retired(relay, old_id)
    assert json.loads((alpha / "config.json").read_text())["sync"]["vault_id"] == old_id
    assert not (alpha / "rekey_state.json").exists()
    assert _cli(alpha, "list", home=tmp_path, ENGRAM_PASSPHRASE=OLD).returncode == 0


def test_force_keeps_a_weak_new_passphrase(tmp_path: Path, relay: Relay) -> None:
    alpha, old_id = _fill(tmp_path, relay)

    kept = _cli(alpha, "rekey", "--force", "--json", home=tmp_path, ENGRAM_NEW_PASSPHRASE=WEAK)

    assert kept.returncode == 0, kept.stderr
    assert "--force: kept anyway" in kept.stderr
    assert json.loads(kept.stdout)["new_vault_id"] == vault_id_v2(WEAK)
    assert _retired(relay, old_id)


def test_a_strong_new_passphrase_needs_no_force(tmp_path: Path, relay: Relay) -> None:
    alpha, old_id = _fill(tmp_path, relay)
    strong = "quartz lantern migrates over seventeen velvet harbours"

    done = _cli(alpha, "rekey", "--json", home=tmp_path, ENGRAM_NEW_PASSPHRASE=strong)

    assert done.returncode == 0, done.stderr
    assert "weak" not in done.stderr
    assert _retired(relay, old_id)
