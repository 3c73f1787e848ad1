"""`engram-sync revoke` refuses a device id the vault's roster does not have (issue 14), asks
before it revokes the device it runs on, and the way back it prints works: `link` with a new
key gives the device a new id, which syncs what waited (issue 31 finding 8)."""

from __future__ import annotations

import json
import os
import pty
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
        stdin=subprocess.DEVNULL,  # not a terminal: nothing is asked
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


def _roster(relay: Relay, vault_id: str) -> dict[str, bool]:
    with relay.client() as admin:
        devices = admin.get(f"/v1/vaults/{vault_id}/devices").json()["devices"]
    return {d["device_id"]: d["revoked"] for d in devices}


def _texts(vault: Path, home: Path) -> set[str]:
    listed = _sync_cli(vault, "list", "--json", home=home)
    assert listed.returncode == 0, listed.stderr
    return {item["content"] for item in json.loads(listed.stdout)}


def test_revoking_this_device_asks_and_link_with_a_new_key_brings_it_back(
    tmp_path: Path, relay: Relay
) -> None:
    laptop, other = tmp_path / "laptop", tmp_path / "other"
    for vault in (laptop, other):
        assert _sync_cli(vault, "init", home=tmp_path).returncode == 0
        link = ("link", "--relay", relay.url, "--api-key", ADMIN_KEY, "--vault-id", "team-self")
        linked = _sync_cli(vault, *link, "--label", vault.name, home=tmp_path)
        assert linked.returncode == 0, linked.stderr
    me = json.loads(_sync_cli(laptop, "status", "--json", home=tmp_path).stdout)["device_id"]
    assert _sync_cli(laptop, "add", "pushed under the old id", home=tmp_path).returncode == 0
    assert _sync_cli(laptop, "sync", home=tmp_path).returncode == 0

    refused = _sync_cli(laptop, "revoke", me, home=tmp_path)  # no terminal, no --yes
    assert refused.returncode != 0
    assert f"{me} is this device" in refused.stderr
    assert "nothing was revoked: pass --yes" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "Traceback" not in refused.stderr
    assert _roster(relay, "team-self")[me] is False

    done = _sync_cli(laptop, "revoke", me, "--yes", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "engram-sync link" in done.stdout  # the way back, which the rest of this test takes
    assert _roster(relay, "team-self")[me] is True
    assert _sync_cli(laptop, "add", "written after the revoke", home=tmp_path).returncode == 0
    failed = _sync_cli(laptop, "sync", home=tmp_path)
    assert failed.returncode == 1
    assert f"this device ({me}) was revoked" in failed.stderr

    new_key = relay.mint("team-self")
    relinked = _sync_cli(laptop, "link", "--relay", relay.url, "--api-key", new_key,
                         "--vault-id", "team-self", home=tmp_path)  # fmt: skip
    assert relinked.returncode == 0, relinked.stderr
    renewed = relinked.stdout.rsplit("(device ", 1)[1].split(")")[0]
    assert renewed != me
    synced = _sync_cli(laptop, "sync", "--json", home=tmp_path)
    assert synced.returncode == 0, synced.stderr
    assert json.loads(synced.stdout)["pushed"] == 1  # the edit that waited

    assert _sync_cli(other, "sync", home=tmp_path).returncode == 0
    both = {"pushed under the old id", "written after the revoke"}
    assert _texts(other, tmp_path) == both
    assert _texts(laptop, tmp_path) == both  # nothing lost on the device itself
    assert _roster(relay, "team-self") == {
        me: True,
        renewed: False,
        _other_id(other, tmp_path): False,
    }


def _other_id(vault: Path, home: Path) -> str:
    return str(json.loads(_sync_cli(vault, "status", "--json", home=home).stdout)["device_id"])


def _revoke_on_a_terminal(vault: Path, device_id: str, home: Path, answer: str) -> tuple[int, str]:
    """`revoke` with stdin on a pseudo-terminal, answering its question with `answer`."""
    master, replica = pty.openpty()
    env = dict(os.environ, ENGRAM_PASSPHRASE="revoke test passphrase", HOME=str(home))
    env.pop("ENGRAM_VAULT", None)
    with subprocess.Popen(
        [EXE, "--vault", str(vault), "revoke", device_id], env=env, stdin=replica,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        os.close(replica)
        os.write(master, answer.encode() + b"\n")
        _, stderr = proc.communicate(timeout=120)
    os.close(master)
    return proc.returncode, stderr


def test_revoking_this_device_on_a_terminal_asks_first(tmp_path: Path, relay: Relay) -> None:
    vault = tmp_path / "desk"
    assert _sync_cli(vault, "init", home=tmp_path).returncode == 0
    link = ("link", "--relay", relay.url, "--api-key", ADMIN_KEY, "--vault-id", "team-ask")
    assert _sync_cli(vault, *link, home=tmp_path).returncode == 0
    me = _other_id(vault, tmp_path)

    code, stderr = _revoke_on_a_terminal(vault, me, tmp_path, "n")
    assert code == 1
    assert "Revoke this device?" in stderr
    assert "error: nothing was revoked" in stderr
    assert _roster(relay, "team-ask")[me] is False
    code, stderr = _revoke_on_a_terminal(vault, me, tmp_path, "y")
    assert code == 0, stderr
    assert _roster(relay, "team-ask")[me] is True
