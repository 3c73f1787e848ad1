"""`engram-sync revoke` refuses a device id the vault's roster does not have (issue 14)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.relay.conftest import ADMIN_KEY, Relay

EXE = str(Path(sys.executable).parent / "engram-sync")


def _sync_cli(vault: Path, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ENGRAM_PASSPHRASE="revoke test passphrase", HOME=str(home))
    env.pop("ENGRAM_VAULT", None)
    return subprocess.run(
        [EXE, "--vault", str(vault), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_revoke_of_an_unknown_device_fails_and_adds_no_phantom(
    tmp_path: Path, relay: Relay
) -> None:
    vault = tmp_path / "vault"
    assert _sync_cli(vault, "init", home=tmp_path).returncode == 0
    linked = _sync_cli(vault, "link", "--relay", relay.url, "--api-key", ADMIN_KEY,
                       "--vault-id", "team-revoke", "--label", "laptop", home=tmp_path)  # fmt: skip
    assert linked.returncode == 0, linked.stderr
    me = linked.stdout.rsplit("(device ", 1)[1].split(")")[0]

    typo = _sync_cli(vault, "revoke", me + "x", home=tmp_path)
    assert typo.returncode != 0
    assert f"vault team-revoke has no device '{me}x'" in typo.stderr
    assert "--force" in typo.stderr
    assert len(typo.stderr.strip().splitlines()) == 1
    assert "Traceback" not in typo.stderr
    with relay.client() as admin:
        roster = admin.get("/v1/vaults/team-revoke/devices").json()["devices"]
    assert [d["device_id"] for d in roster] == [me]  # no phantom revoked device

    forced = _sync_cli(vault, "revoke", "stolen-phone", "--force", home=tmp_path)
    assert forced.returncode == 0, forced.stderr
    with relay.client() as admin:
        roster = admin.get("/v1/vaults/team-revoke/devices").json()["devices"]
    assert {d["device_id"]: d["revoked"] for d in roster} == {me: False, "stolen-phone": True}
