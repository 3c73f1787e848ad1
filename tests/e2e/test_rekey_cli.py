"""`engram-sync rekey` through the real executable against a real relay (PROTOCOL §19).

A re-key moves every live memory and tombstone of the vault (two devices' versions) to the
new vault, decrypted sets compared; the old vault refuses pushes after it; the vault
database opens with the new passphrase only. Killed (SIGKILL, the ENGRAM_REKEY_TEST_KILL
hook) at chosen points, every reader sees the vault wholly old (the old vault complete and
not retired) or wholly new (the new vault complete and the old one retired), and running
`rekey` again finishes with the same result. One kill point at CI size; `--full` runs the
others and 20 random ones (tests/tiers.py; docs/rekey.md gives the figure).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from engram_sync.client._errors import RelayError
from engram_sync.client._http.relay_client import RelayClient
from engram_sync.client._session import VaultSession
from engram_sync.client._vault import store
from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.plaintext import MemoryPlaintext, decode_plaintext
from engram_sync.shared_format.sync_keys import SyncKeys, derive_sync_keys, vault_id_v2
from engram_sync.shared_format.wire import SyncBlob
from tests.relay.conftest import ADMIN_KEY, Relay

EXE = str(Path(sys.executable).parent / "engram-sync")
OLD = "rekey old passphrase"
#: One kill point at CI size (mid-copy); the others with `--full` (tests/tiers.py).
KILL_POINTS = (
    pytest.param("step:pulled", marks=pytest.mark.full),
    "batch:2",
    pytest.param("step:checked", marks=pytest.mark.full),
    pytest.param("step:retired", marks=pytest.mark.full),
    pytest.param("step:db_rekeyed", marks=pytest.mark.full),
)
#: `--full`: this many re-keys killed at random points of ALL_POINTS.
RANDOM_KILLS = 20
ALL_POINTS = (
    "step:pulled",
    "step:key-stored",
    "step:started",
    "batch:1",
    "batch:2",
    "batch:3",
    "step:copied",
    "step:checked",
    "step:retired",
    "step:switched",
    "step:db_rekeyed",
)

Versions = dict[str, tuple[str, int, bool, str | None]]


def _cli(vault: Path, *args: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, ENGRAM_PASSPHRASE=OLD, HOME=str(home), ENGRAM_REKEY_BATCH="4")
    for name in ("ENGRAM_VAULT", "ENGRAM_NEW_PASSPHRASE", "ENGRAM_NEW_API_KEY"):
        full.pop(name, None)
    full.pop("ENGRAM_REKEY_TEST_KILL", None)
    full.update(env)
    return subprocess.run(
        [EXE, "--vault", str(vault), *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _device(path: Path, relay: Relay, vault_id: str, passphrase: str = OLD) -> None:
    with VaultSession.open(path, passphrase, create=True) as session:
        session.link(relay.url, ADMIN_KEY, vault_id, path.name)


def _sync(path: Path, passphrase: str = OLD) -> None:
    with VaultSession.open(path, passphrase) as session, session.relay() as relay:
        session.syncer(relay).sync()


def _fill(tmp_path: Path, relay: Relay, passphrase: str = OLD) -> tuple[Path, str]:
    """Two devices on one passphrase vault: 13 live memories and 3 tombstones, synced."""
    alpha, bravo = tmp_path / "alpha", tmp_path / "bravo"
    vault_id = vault_id_v2(passphrase)
    _device(alpha, relay, vault_id, passphrase)
    _device(bravo, relay, vault_id, passphrase)
    with VaultSession.open(alpha, passphrase) as session, session.vault.transaction() as conn:
        ids = [store.add_memory(conn, f"alpha memory {i}", tags=["t"]) for i in range(10)]
        store.delete_memory(conn, ids[0])
    _sync(alpha, passphrase)
    _sync(bravo, passphrase)
    with VaultSession.open(bravo, passphrase) as session, session.vault.transaction() as conn:
        for i in range(6):
            store.add_memory(conn, f"bravo memory {i}")
        store.delete_memory(conn, ids[1])
        store.edit_memory(conn, ids[2], "alpha memory 2, edited on bravo")
        store.delete_memory(conn, ids[3])
    _sync(bravo, passphrase)
    _sync(alpha, passphrase)
    return alpha, vault_id


def _decrypted(relay: Relay, vault_id: str, keys: SyncKeys) -> Versions:
    """memory id -> (device_id, clock, deleted, content) of every blob that verifies."""
    cipher = BlobCipher(keys)
    found: Versions = {}
    blobs: list[SyncBlob] = []
    with RelayClient(relay.url, ADMIN_KEY) as client:
        cursor = 0
        while True:
            page = client.pull(vault_id, cursor=cursor, limit=1000)
            blobs.extend(page.blobs)
            assert isinstance(page.cursor, int)
            cursor = page.cursor
            if not page.has_more:
                break
    for blob in blobs:
        decoded = decode_plaintext(cipher.open(blob), expected_id=blob.memory_id)
        content = decoded.content if isinstance(decoded, MemoryPlaintext) else None
        found[blob.memory_id] = (blob.device_id, blob.vector_clock, blob.deleted, content)
    return found


def _retired(relay: Relay, vault_id: str) -> bool:
    with relay.client() as client:
        answer = client.get(f"/v1/vaults/{vault_id}/pull", params={"cursor": 0, "limit": 1})
    assert answer.status_code == 200, answer.text
    return "retired" in answer.json()


def _push_probe(relay: Relay, vault_id: str, keys: SyncKeys) -> RelayError | None:
    blob = BlobCipher(keys).seal(
        '{"id":"mem_probe"}',
        vault_id=vault_id,
        memory_id="mem_probe",
        device_id="probe-device",
        vector_clock=2**40,
        deleted=True,
    )
    with RelayClient(relay.url, ADMIN_KEY, max_retries=0) as client:
        try:
            client.push(vault_id, [blob])
        except RelayError as exc:
            return exc
    return None


@pytest.fixture(scope="module")
def old_keys() -> SyncKeys:
    return derive_sync_keys(OLD)


def test_rekey_moves_every_memory_and_tombstone_and_retires_the_old_vault(
    tmp_path: Path, relay: Relay, old_keys: SyncKeys
) -> None:
    alpha, old_id = _fill(tmp_path, relay)
    before = _decrypted(relay, old_id, old_keys)
    assert sum(1 for v in before.values() if v[2]) == 3  # tombstones
    assert len({v[0] for v in before.values()}) == 2  # versions of two devices
    new = "rekey new passphrase"

    done = _cli(alpha, "rekey", "--json", home=tmp_path, ENGRAM_NEW_PASSPHRASE=new)

    assert done.returncode == 0, done.stderr
    summary: dict[str, Any] = json.loads(done.stdout)
    new_id = vault_id_v2(new)
    assert (summary["old_vault_id"], summary["new_vault_id"]) == (old_id, new_id)
    assert (summary["live"], summary["tombstones"], summary["pushed"]) == (13, 3, 16)
    assert summary["batches"] == 4  # 16 versions, 4 per batch
    assert summary["db_rekeyed"] is True
    assert isinstance(summary["write_refused_s"], float)
    assert _decrypted(relay, new_id, derive_sync_keys(new)) == before  # same versions
    refused = _push_probe(relay, old_id, old_keys)
    assert refused is not None
    assert (refused.status, refused.code) == (410, "vault_retired")
    config = json.loads((alpha / "config.json").read_text())["sync"]
    assert config["vault_id"] == new_id
    assert not (alpha / "rekey_state.json").exists()
    # the database opens with the new passphrase only, and holds the same memories
    assert _cli(alpha, "list", home=tmp_path).returncode != 0
    listed = _cli(alpha, "list", "--json", home=tmp_path, ENGRAM_PASSPHRASE=new)
    assert listed.returncode == 0, listed.stderr
    live = {mid: v[3] for mid, v in before.items() if not v[2]}
    assert {m["id"]: m["content"] for m in json.loads(listed.stdout)} == live
    # and syncs on with the new vault: nothing to pull again, a new memory lands there
    added = _cli(alpha, "add", "after the re-key", home=tmp_path, ENGRAM_PASSPHRASE=new)
    assert added.returncode == 0, added.stderr
    synced = _cli(alpha, "sync", "--json", home=tmp_path, ENGRAM_PASSPHRASE=new)
    assert synced.returncode == 0, synced.stderr
    report = json.loads(synced.stdout)
    assert (report["pulled"], report["pushed"]) == (0, 1)
    assert report["digest"]["matched"] is True
    assert len(_decrypted(relay, new_id, derive_sync_keys(new))) == 17
    assert _push_probe(relay, new_id, derive_sync_keys(new)) is None  # positive case


def _kill_and_finish(
    tmp_path: Path, relay: Relay, point: str, old: str, new: str
) -> tuple[Versions, str, str]:
    """One re-key killed at `point`, checked, then finished: (versions, old id, new id)."""
    alpha, old_id = _fill(tmp_path, relay, old)
    old_keys, new_keys = derive_sync_keys(old), derive_sync_keys(new)
    before = _decrypted(relay, old_id, old_keys)
    new_id = vault_id_v2(new)
    env = {"ENGRAM_PASSPHRASE": old, "ENGRAM_NEW_PASSPHRASE": new}

    killed = _cli(alpha, "rekey", home=tmp_path, ENGRAM_REKEY_TEST_KILL=point, **env)

    assert killed.returncode == -9, (point, killed.stderr)
    # every reader sees the vault wholly old or wholly new
    if _retired(relay, old_id):
        assert _decrypted(relay, new_id, new_keys) == before, point
    else:
        assert _decrypted(relay, old_id, old_keys) == before, point
    finished = _cli(alpha, "rekey", "--json", home=tmp_path, **env)
    assert finished.returncode == 0, (point, finished.stderr)
    assert json.loads(finished.stdout)["resumed"] is (point != "step:pulled"), point
    assert _retired(relay, old_id)
    assert _decrypted(relay, new_id, new_keys) == before, point
    assert _decrypted(relay, old_id, old_keys) == before, point  # the old one kept as it was
    assert json.loads((alpha / "config.json").read_text())["sync"]["vault_id"] == new_id
    listed = _cli(alpha, "list", "--json", home=tmp_path, ENGRAM_PASSPHRASE=new)
    assert listed.returncode == 0, (point, listed.stderr)
    assert len(json.loads(listed.stdout)) == 13
    return before, old_id, new_id


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_rekey_killed_at_any_point_finishes_when_run_again(
    tmp_path: Path, relay: Relay, point: str
) -> None:
    _kill_and_finish(tmp_path, relay, point, OLD, f"new passphrase for {point}")


@pytest.mark.full
@pytest.mark.timeout(120 * RANDOM_KILLS)
def test_random_kill_points(tmp_path: Path, relay: Relay) -> None:
    rounds = RANDOM_KILLS
    rng = random.Random(int(os.environ.get("ENGRAM_REKEY_RANDOM_SEED", "16")))
    for i in range(rounds):
        point = rng.choice(ALL_POINTS)
        place = tmp_path / f"round{i}"
        place.mkdir()
        _kill_and_finish(place, relay, point, f"old passphrase {i}", f"new passphrase {i}")
        print(f"round {i + 1}/{rounds}: killed at {point}, finished")  # the figure, with -s


def test_a_resume_with_another_new_passphrase_is_refused(tmp_path: Path, relay: Relay) -> None:
    alpha, old_id = _fill(tmp_path, relay)
    env = {"ENGRAM_NEW_PASSPHRASE": "the first new passphrase"}
    killed = _cli(alpha, "rekey", home=tmp_path, ENGRAM_REKEY_TEST_KILL="batch:1", **env)
    assert killed.returncode == -9

    other = _cli(alpha, "rekey", home=tmp_path, ENGRAM_NEW_PASSPHRASE="another one")

    assert other.returncode == 1
    assert "another vault id than the re-key under way" in other.stderr
    assert "Traceback" not in other.stderr
    assert not _retired(relay, old_id)
    same = _cli(alpha, "rekey", home=tmp_path, **env)  # positive case: the same one finishes
    assert same.returncode == 0, same.stderr
    assert _retired(relay, old_id)


def test_a_new_vault_holding_foreign_blobs_is_refused(tmp_path: Path, relay: Relay) -> None:
    alpha, old_id = _fill(tmp_path, relay)
    new = "a passphrase someone else used"
    squatter = tmp_path / "squatter"
    _device(squatter, relay, vault_id_v2(new), "not the same keys at all")
    foreign = "not the same keys at all"
    with VaultSession.open(squatter, foreign) as session, session.vault.transaction() as conn:
        store.add_memory(conn, "foreign")
    _sync(squatter, "not the same keys at all")

    refused = _cli(alpha, "rekey", home=tmp_path, ENGRAM_NEW_PASSPHRASE=new)

    assert refused.returncode == 1
    assert "do not verify under the new keys" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not _retired(relay, old_id)
    with httpx.Client(base_url=relay.url) as client:
        assert "retire" in client.get("/v1/info").json()["features"]
