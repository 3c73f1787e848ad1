"""Several vaults on one device (issue 17): `engram-sync vaults add|remove`, `--vault NAME`
through the registry under the user's config directory, and `vaults` listing each with its
relay and state, through the real executable, real SQLCipher vaults and a real relay."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.relay.conftest import ADMIN_KEY, Relay

EXE = str(Path(sys.executable).parent / "engram-sync")
PASSPHRASE = "several vaults correct horse battery staple"


def cli(home: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE, HOME=str(home),
               XDG_CONFIG_HOME=str(home / "config"))  # fmt: skip
    env.pop("ENGRAM_VAULT", None)
    return subprocess.run(
        [EXE, *args],
        env=env,
        cwd=cwd or home.parent,  # never the checkout: a bare name that misses is a path
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_named_vaults_resolve_and_list_with_their_relay_and_state(
    tmp_path: Path, relay: Relay
) -> None:
    home = tmp_path / "home"
    work, notes = tmp_path / "work-vault", tmp_path / "notes-vault"
    assert "no named vaults" in ok(cli(home, "vaults"))
    ok(cli(home, "vaults", "add", "work", str(work)))
    ok(cli(home, "vaults", "add", "notes", str(notes)))
    registry = home / "config" / "engram-sync" / "vaults.json"
    assert json.loads(registry.read_text(encoding="utf-8")) == {
        "vaults": {"notes": str(notes), "work": str(work)}
    }
    assert registry.stat().st_mode & 0o777 == 0o600

    # --vault NAME is the registered directory
    ok(cli(home, "--vault", "work", "init"))
    ok(cli(home, "--vault", "notes", "init"))
    assert (work / "engrams.db").exists()
    assert (notes / "engrams.db").exists()
    memory_id = ok(cli(home, "--vault", "work", "add", "only in the work vault")).strip()
    assert [m["id"] for m in json.loads(ok(cli(home, "--vault", "work", "list", "--json")))] == [
        memory_id
    ]
    assert json.loads(ok(cli(home, "--vault", "notes", "list", "--json"))) == []
    # a path is a path: the same directory by its path
    assert memory_id in ok(cli(home, "--vault", str(work), "list", "--json"))
    # a bare word that is no registered name is a directory (relative to the working dir)
    ok(cli(home, "--vault", "unregistered", "init", cwd=tmp_path))
    assert (tmp_path / "unregistered" / "engrams.db").exists()

    ok(cli(home, "--vault", "work", "link", "--relay", relay.url, "--api-key", ADMIN_KEY,
           "--vault-id", "work-notes", "--label", "laptop"))  # fmt: skip
    listed = {row["name"]: row for row in json.loads(ok(cli(home, "vaults", "--json")))}
    assert set(listed) == {"work", "notes"}
    assert (listed["work"]["relay"], listed["work"]["vault_id"]) == (relay.url, "work-notes")
    assert listed["work"]["state"] == "linked, never synced"
    assert listed["notes"]["state"] == "not linked"
    ok(cli(home, "--vault", "work", "sync"))
    listed = {row["name"]: row for row in json.loads(ok(cli(home, "vaults", "--json")))}
    assert listed["work"]["state"] == "synced"
    assert listed["work"]["last_sync_at"]
    text = ok(cli(home, "vaults"))
    assert f"work  {work}  {relay.url} (work-notes)  synced, last sync" in text
    assert f"notes  {notes}  -  not linked" in text

    # names are checked, taken names kept, removal forgets the name only
    bad = cli(home, "vaults", "add", "no/slash", str(tmp_path))
    assert bad.returncode == 1
    assert "is not a vault name" in bad.stderr
    taken = cli(home, "vaults", "add", "work", str(notes))
    assert taken.returncode == 1
    assert "is taken" in taken.stderr
    assert "removed the name notes" in ok(cli(home, "vaults", "remove", "notes"))
    assert (notes / "engrams.db").exists()
    assert [row["name"] for row in json.loads(ok(cli(home, "vaults", "--json")))] == ["work"]
    gone = cli(home, "vaults", "remove", "notes")
    assert gone.returncode == 1
    assert "no vault named 'notes'" in gone.stderr


def test_a_broken_registry_is_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    registry = home / "config" / "engram-sync" / "vaults.json"
    registry.parent.mkdir(parents=True)
    registry.write_text('{"vaults": ["not", "a", "map"]}', encoding="utf-8")
    result = cli(home, "vaults")
    assert result.returncode == 1
    assert "is not a vault registry" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
