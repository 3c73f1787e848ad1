"""The other devices meet a retired vault (PROTOCOL §19; docs/rekey.md "Other devices").

A real relay, real SQLCipher vaults, real crypto. One device re-keys (client._flows.rekey);
the others learn of it from a push refused 410 `vault_retired` or from a pull's `retired`,
keep every unpushed edit, and switch only with a key they obtained themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from engram_sync.client._accounts import account
from engram_sync.client._errors import VaultRetiredError
from engram_sync.client._flows.rekey import Rekey
from engram_sync.client._flows.successor import JoinError, join_with_handoff, join_with_passphrase
from engram_sync.client._http.relay_client import RelayClient
from engram_sync.client._session import VaultSession
from engram_sync.client._vault import vault_key_store as vault_keys
from engram_sync.client._vault.store import count_to_push
from engram_sync.shared_format.b64 import b64encode_std
from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.errors import WrongPassphraseError
from engram_sync.shared_format.plaintext import MemoryPlaintext, decode_plaintext
from engram_sync.shared_format.sync_keys import SyncKeys, derive_sync_keys, vault_id_v2
from engram_sync.shared_format.wraps import wrap_vault_key
from tests.e2e.conftest import PASSPHRASE, DeviceHandle, make_device
from tests.e2e.helpers import add, contents, delete, edit
from tests.relay.conftest import ADMIN_KEY, Relay

NEW = "the re-keyed passphrase, after the laptop was lost"


def _relay_contents(relay: Relay, vault_id: str, keys: SyncKeys) -> dict[str, str | None]:
    """memory id -> content (None: a tombstone) of the vault's current versions, every blob
    verified and decrypted here."""
    cipher = BlobCipher(keys)
    current: dict[str, tuple[int, str | None]] = {}
    cursor = 0
    with RelayClient(relay.url, ADMIN_KEY) as client:
        while True:
            page = client.pull(vault_id, cursor=cursor, limit=500)
            for blob in page.blobs:
                decoded = decode_plaintext(cipher.open(blob), expected_id=blob.memory_id)
                text = decoded.content if isinstance(decoded, MemoryPlaintext) else None
                if blob.deleted:
                    text = None
                if blob.vector_clock >= current.get(blob.memory_id, (-1, None))[0]:
                    current[blob.memory_id] = (blob.vector_clock, text)
            assert isinstance(page.cursor, int)
            cursor = page.cursor
            if not page.has_more:
                break
    return {memory_id: text for memory_id, (_, text) in current.items()}


def _rekey(device: DeviceHandle, new_passphrase: str) -> str:
    """The re-key on `device` (the library the `rekey` command runs); its new vault id."""
    with device.open() as session:
        report = Rekey(session).run(new_passphrase=new_passphrase, new_api_key=None)
    device.passphrase = new_passphrase
    return report.new_vault_id


def _pending(device: DeviceHandle) -> tuple[int, int]:
    with device.open() as session:
        return count_to_push(session.vault.conn)


def test_an_offline_device_lands_all_50_unpushed_edits_in_the_successor(
    tmp_path: Path, relay: Relay
) -> None:
    alpha, bravo = make_device(tmp_path, relay, "alpha"), make_device(tmp_path, relay, "bravo")
    ids = [add(alpha, f"memory {i}") for i in range(30)]
    alpha.sync()
    bravo.sync()
    # bravo is offline through the re-key: 20 edits, 25 new memories, 5 deletions
    for memory_id in ids[:20]:
        edit(bravo, memory_id, f"edited offline {memory_id}")
    added = [add(bravo, f"written offline {i}") for i in range(25)]
    for memory_id in ids[20:25]:
        delete(bravo, memory_id)
    assert _pending(bravo) == (45, 5)
    expected = contents(bravo)

    successor = _rekey(alpha, NEW)
    assert successor == vault_id_v2(NEW)

    with pytest.raises(VaultRetiredError) as raised:
        bravo.sync()
    assert raised.value.successor == successor
    assert "rekey --join" in raised.value.message
    assert "50 unpushed change(s) are kept" in raised.value.message
    assert _pending(bravo) == (45, 5)  # nothing dropped, nothing marked pushed
    with bravo.open() as session:
        assert session.state.retired is not None
        assert session.state.retired.successor == successor
        assert raised.value.message in (session.state.last_error or "")  # `status` shows it

    with bravo.open() as session:
        joined = join_with_passphrase(session, NEW)
    assert joined.hint_matched
    assert joined.successor_verified
    assert joined.db_rekeyed
    assert joined.pending == 50
    bravo.passphrase = NEW

    report = bravo.sync()
    assert report.pushed == 50
    assert _pending(bravo) == (0, 0)
    on_relay = _relay_contents(relay, successor, derive_sync_keys(NEW))
    for memory_id in ids[:20]:
        assert on_relay[memory_id] == f"edited offline {memory_id}"
    for i, memory_id in enumerate(added):
        assert on_relay[memory_id] == f"written offline {i}"
    for memory_id in ids[20:25]:
        assert on_relay[memory_id] is None
    assert {m: t for m, t in on_relay.items() if t is not None} == expected

    alpha.sync()
    assert contents(alpha) == expected
    bravo.restart()
    with pytest.raises(WrongPassphraseError):
        VaultSession.open(bravo.path, PASSPHRASE).close()  # engrams.db is on the new one


def test_a_pull_only_device_learns_of_the_retirement_from_the_pull(
    tmp_path: Path, relay: Relay
) -> None:
    alpha, charlie = make_device(tmp_path, relay, "alpha"), make_device(tmp_path, relay, "charlie")
    add(alpha, "one")
    alpha.sync()
    charlie.sync()
    successor = _rekey(alpha, NEW)
    with pytest.raises(VaultRetiredError) as raised:
        charlie.sync()
    assert "no unpushed changes" in raised.value.message
    with charlie.open() as session:
        hint = session.state.retired
        assert hint is not None
        assert (hint.source, hint.successor) == ("pull", successor)
        assert hint.erase_after  # the pull's `retired` says when the old blobs go
    with charlie.open() as session:
        joined = join_with_passphrase(session, NEW)
    charlie.passphrase = NEW
    assert joined.successor_verified
    charlie.sync()
    assert contents(charlie) == contents(alpha)


def test_a_passphrase_that_gives_another_vault_needs_confirmation(
    tmp_path: Path, relay: Relay
) -> None:
    alpha, bravo = make_device(tmp_path, relay, "alpha"), make_device(tmp_path, relay, "bravo")
    add(alpha, "one")
    alpha.sync()
    bravo.sync()
    _rekey(alpha, NEW)
    with pytest.raises(VaultRetiredError):
        bravo.sync()
    with bravo.open() as session, pytest.raises(JoinError, match="--force"):
        join_with_passphrase(session, "a mistyped new passphrase")
    with bravo.open() as session:
        assert session.config.vault_id != vault_id_v2(NEW)  # nothing switched
        assert session.state.retired is not None


EMAIL = "retire@example.org"
PASSWORD = "the account password of the team"
EXE = str(Path(sys.executable).parent / "engram-sync")


def _account_device(tmp_path: Path, relay: Relay, name: str) -> DeviceHandle:
    """A device linked through the account (its K from the account's wrap, PROTOCOL §13)."""
    passphrase = f"{name}'s own local passphrase"
    VaultSession.open(tmp_path / name, passphrase, create=True).close()
    device = DeviceHandle(name, tmp_path / name, relay, passphrase=passphrase)
    with device.open() as session:
        account.signin(session.path, relay.url, EMAIL, PASSWORD)
        account.link_with_account(session, relay.url, PASSWORD, label=name)
    return device


def _account_mint(device: DeviceHandle) -> Callable[[str, bytes], str]:
    """What the re-key of an account vault does with the new K: its wrap into the account,
    and a key minted for the new vault."""

    def mint(vault_id: str, k: bytes) -> str:
        unlocked = account.unlock(device.path, PASSWORD)
        wrapped = b64encode_std(wrap_vault_key(k, unlocked.account_key))
        with unlocked.client() as client:
            client.put_vault_wrap(vault_id, wrapped, unlocked.secret)
            return client.mint_key(vault_id, device_id=None, label="rekey").key

    return mint


def test_an_account_device_switches_on_its_next_sync_with_the_wrap(
    tmp_path: Path, relay: Relay
) -> None:
    alpha = make_device(tmp_path, relay, "alpha")
    ids = [add(alpha, f"team memory {i}") for i in range(5)]
    alpha.sync()
    with alpha.open() as session:
        account.signup(session.path, relay.url, EMAIL, PASSWORD)
        account.open_vault(session, PASSWORD)
    bravo, charlie = (
        _account_device(tmp_path, relay, "bravo"),
        _account_device(tmp_path, relay, "charlie"),
    )
    bravo.sync()
    charlie.sync()
    edit(bravo, ids[0], "edited by bravo while charlie re-keys")
    written = add(bravo, "written by bravo while charlie re-keys")

    with charlie.open() as session:  # an account vault: a new random K
        session.config.api_key = ADMIN_KEY  # the operator's key retires the old vault
        report = Rekey(session).run(
            new_passphrase=None, new_api_key=None, mint_key=_account_mint(charlie)
        )
    successor = report.new_vault_id
    bravo.restart()

    env = dict(
        os.environ,
        ENGRAM_PASSPHRASE=bravo.passphrase,
        ENGRAM_ACCOUNT_PASSWORD=PASSWORD,
        HOME=str(tmp_path / "home"),
    )
    env.pop("ENGRAM_VAULT", None)
    run = subprocess.run(
        [EXE, "--vault", str(bravo.path), "sync"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 0, run.stderr
    assert f"now syncs its successor {successor}" in run.stderr
    assert "2 unpushed change(s) go there now" in run.stderr
    assert "pushed 2" in run.stdout
    with bravo.open() as session:
        assert session.config.vault_id == successor
        assert vault_keys.key_source(session.vault.conn, successor) == "account"
        assert session.state.rekeyed_from == "team-e2e"
        k = vault_keys.stored_vault_key(session.vault.conn, successor)
        assert k is not None
        keys = SyncKeys(enc_key=k.enc_key, hmac_key=k.hmac_key)
    on_relay = _relay_contents(relay, successor, keys)
    assert on_relay[ids[0]] == "edited by bravo while charlie re-keys"
    assert on_relay[written] == "written by bravo while charlie re-keys"
    bravo.restart()
    assert bravo.sync().pushed == 0  # said once: the next sync is an ordinary one


def _cli(
    device: DeviceHandle, home: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE, HOME=str(home))
    for name in ("ENGRAM_VAULT", "ENGRAM_NEW_PASSPHRASE", "ENGRAM_NEW_API_KEY"):
        full.pop(name, None)
    full.update(env)
    return subprocess.run(
        [EXE, "--vault", str(device.path), *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_sync_status_and_rekey_join_through_the_executable(tmp_path: Path, relay: Relay) -> None:
    alpha, bravo = make_device(tmp_path, relay, "alpha"), make_device(tmp_path, relay, "bravo")
    add(alpha, "shared")
    alpha.sync()
    bravo.sync()
    written = add(bravo, "written offline on bravo")
    bravo.restart()
    successor = _rekey(alpha, NEW)
    home = tmp_path / "home"

    run = _cli(bravo, home, "sync")
    assert run.returncode == 1
    assert "was re-keyed on another device and retired" in run.stderr
    assert "1 unpushed change(s) are kept" in run.stderr
    assert "`engram-sync rekey --join`" in run.stderr
    status = json.loads(_cli(bravo, home, "status", "--json").stdout)
    assert status["retired"]["successor"] == successor
    assert "re-keyed on another device" in status["last_error"]
    assert status["pending_pushes"] == 1

    wrong = _cli(bravo, home, "rekey", "--join", ENGRAM_NEW_PASSPHRASE="not the new one")
    assert wrong.returncode == 1
    assert "--force" in wrong.stderr  # a vault the relay did not name: not followed
    joined = _cli(bravo, home, "rekey", "--join", ENGRAM_NEW_PASSPHRASE=NEW)
    assert joined.returncode == 0, joined.stderr
    assert f"this device now syncs vault {successor}" in joined.stdout
    assert "engrams.db now opens with the new passphrase" in joined.stdout

    synced = _cli(bravo, home, "sync", ENGRAM_PASSPHRASE=NEW)
    assert synced.returncode == 0, synced.stderr
    assert "pushed 1" in synced.stdout
    status = json.loads(_cli(bravo, home, "status", "--json", ENGRAM_PASSPHRASE=NEW).stdout)
    assert status["vault_id"] == successor
    assert status["retired"] == {
        "successor": None,
        "erase_after": None,
        "seen_at": None,
        "rekeyed_from": "team-e2e",
    }
    assert status["last_error"] is None
    alpha.sync()
    assert written in contents(alpha)


def test_a_team_device_waits_for_the_handoff_then_pushes_its_edits(
    tmp_path: Path, relay: Relay
) -> None:
    """A member whose K came by the handoff (§14): `rekey --join` points it at the successor
    with its key expected from the handoff; nothing syncs until K arrives, then its
    unpushed edits go there. (The handoff itself is tests/e2e/test_accounts.py's; here its
    result, K stored with source `handoff`, is written directly.)"""
    alpha, bravo = make_device(tmp_path, relay, "alpha"), make_device(tmp_path, relay, "bravo")
    with bravo.open() as session, session.vault.transaction() as conn:
        vault_keys.store_vault_key(
            conn, vault_keys.pack_keys(derive_sync_keys(PASSPHRASE), "team-e2e"), "handoff"
        )
    add(alpha, "shared")
    alpha.sync()
    bravo.sync()
    written = add(bravo, "written by the member")
    successor = _rekey(alpha, NEW)
    with pytest.raises(VaultRetiredError, match="team request"):
        bravo.sync()
    with bravo.open() as session:
        joined = join_with_handoff(session)
        assert joined.waiting_for_key
        assert session.config.vault_id == successor
        assert vault_keys.key_source(session.vault.conn, successor) == "missing"
    with pytest.raises(vault_keys.VaultKeyMissingError):
        bravo.sync()  # no key: nothing pushed under the wrong keys, nothing pulled
    assert _pending(bravo) == (1, 0)
    bravo.restart()
    with bravo.open() as session, session.vault.transaction() as conn:  # the handoff's K
        vault_keys.store_vault_key(
            conn, vault_keys.pack_keys(derive_sync_keys(NEW), successor), "handoff"
        )
    assert bravo.sync().pushed == 1
    assert _relay_contents(relay, successor, derive_sync_keys(NEW))[written] == (
        "written by the member"
    )
