"""The re-key library (client._flows.rekey, `Vault.rekey`; PROTOCOL §19) against a real relay.

A vault whose K came from an account or a handoff gets a new random K and vault id (the
decrypted sets of the two vaults compared; the local passphrase unchanged); a version
edited here after the re-key's first sync is copied from the old vault's blob (the old
version, at its clock) and the edit itself lands in the new vault with the next sync; a
retire refused for a non-admin key says what to do and, once linked with an admin key,
running it again finishes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from msgspec import UnsetType

from engram_sync.client import RekeyError, Vault
from engram_sync.client._flows.rekey import STATE_FILE, Rekey
from engram_sync.client._http.relay_client import RelayClient
from engram_sync.client._session import VaultSession
from engram_sync.client._vault import store
from engram_sync.client._vault.vault_key_store import key_source, store_vault_key, stored_vault_key
from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.plaintext import MemoryPlaintext, decode_plaintext
from engram_sync.shared_format.sync_keys import SyncKeys
from engram_sync.shared_format.wraps import pack_vault_key
from tests.relay.conftest import ADMIN_KEY, Relay

PASSPHRASE = "rekey library test passphrase"

Versions = dict[str, tuple[str, int, bool, str | None]]


def _decrypted(relay: Relay, vault_id: str, keys: SyncKeys) -> Versions:
    cipher = BlobCipher(keys)
    found: Versions = {}
    with RelayClient(relay.url, ADMIN_KEY) as client:
        page = client.pull(vault_id, cursor=0, limit=1000)
    assert not page.has_more
    for blob in page.blobs:
        decoded = decode_plaintext(cipher.open(blob), expected_id=blob.memory_id)
        content = decoded.content if isinstance(decoded, MemoryPlaintext) else None
        found[blob.memory_id] = (blob.device_id, blob.vector_clock, blob.deleted, content)
    return found


def _keys(session: VaultSession, vault_id: str) -> SyncKeys:
    stored = stored_vault_key(session.vault.conn, vault_id)
    assert stored is not None
    return SyncKeys(enc_key=stored.enc_key, hmac_key=stored.hmac_key)


def _team_vault(path: Path, relay: Relay, vault_id: str, api_key: str = ADMIN_KEY) -> list[str]:
    """A device holding a team vault's K (as after a handoff): 5 memories, 1 deleted, synced."""
    with VaultSession.open(path, PASSPHRASE, create=True) as session:
        team_k = pack_vault_key(bytes(range(32)), bytes(range(32, 64)), vault_id)
        with session.vault.transaction() as conn:
            store_vault_key(conn, team_k, "handoff")
        session.link(relay.url, api_key, vault_id, "laptop")
        with session.vault.transaction() as conn:
            ids = [store.add_memory(conn, f"team memory {i}") for i in range(5)]
            store.delete_memory(conn, ids[0])
        with session.relay() as client:
            session.syncer(client).sync()
    return ids


def test_a_team_vault_gets_a_new_random_key_and_vault_id(tmp_path: Path, relay: Relay) -> None:
    path = tmp_path / "laptop"
    _team_vault(path, relay, "team-rekey")
    with VaultSession.open(path, PASSPHRASE) as session:
        before = _decrypted(relay, "team-rekey", _keys(session, "team-rekey"))

    with Vault.open(path, PASSPHRASE) as vault:
        report = vault.rekey()
        assert vault.vault_id == report.new_vault_id

    assert report.kind == "random"
    assert re.fullmatch(r"[0-9a-f]{64}", report.new_vault_id)
    assert (report.live, report.tombstones) == (4, 1)
    assert report.db_rekeyed is False
    with VaultSession.open(path, PASSPHRASE) as session:  # the local passphrase is unchanged
        new_keys = _keys(session, report.new_vault_id)
        assert new_keys.enc_key != bytes(range(32))
        assert stored_vault_key(session.vault.conn, "team-rekey") is None  # old K forgotten
        assert key_source(session.vault.conn, report.new_vault_id) == "account"
        assert session.config.vault_id == report.new_vault_id
    assert _decrypted(relay, report.new_vault_id, new_keys) == before
    assert not (path / STATE_FILE).exists()


def test_a_version_edited_here_during_the_rekey_is_copied_from_the_old_vault(
    tmp_path: Path, relay: Relay
) -> None:
    path = tmp_path / "laptop"
    ids = _team_vault(path, relay, "team-edited")
    with VaultSession.open(path, PASSPHRASE) as session:
        before = _decrypted(relay, "team-edited", _keys(session, "team-edited"))

        def edit_during_copy(done: int, total: int) -> None:
            if done == 0:  # after the first sync, before the first batch
                with session.vault.transaction() as conn:
                    assert store.edit_memory(conn, ids[1], "edited during the re-key")

        report = Rekey(session, progress=edit_during_copy).run(
            new_passphrase=None, new_api_key=None
        )
        new_keys = _keys(session, report.new_vault_id)
        # the new vault holds the old version (its clock, its content), not the edit
        assert _decrypted(relay, report.new_vault_id, new_keys) == before
        assert before[ids[1]][3] == "team memory 1"
        with session.relay() as client:
            synced = session.syncer(client).sync()
    assert synced.pushed == 1  # the edit, kept unpushed, lands in the new vault
    after = _decrypted(relay, report.new_vault_id, new_keys)
    assert after[ids[1]][3] == "edited during the re-key"
    assert after[ids[1]][1] > before[ids[1]][1]


def test_a_refused_retire_says_what_to_do_and_a_rerun_finishes(
    tmp_path: Path, relay: Relay
) -> None:
    member_key = relay.mint("team-member", admin=False)
    path = tmp_path / "laptop"
    _team_vault(path, relay, "team-member", api_key=member_key)
    with Vault.open(path, PASSPHRASE) as vault:
        with pytest.raises(RekeyError, match="not an admin key") as refused:
            vault.rekey(new_api_key=ADMIN_KEY)  # the new vault with an admin key
        assert "engram-sync link" in str(refused.value)
        assert vault.vault_id == "team-member"  # not switched
    assert (path / STATE_FILE).exists()
    with RelayClient(relay.url, ADMIN_KEY) as client:
        assert isinstance(client.pull("team-member", cursor=0, limit=1).retired, UnsetType)

    with Vault.open(path, PASSPHRASE) as vault:
        vault.link(relay.url, ADMIN_KEY, vault_id="team-member")  # an admin key now
        report = vault.rekey()
        assert report.resumed is True
        assert report.pushed == 0  # the new vault held everything already
        assert report.already_there == 5
        assert vault.vault_id == report.new_vault_id


def test_a_passphrase_rekey_needs_a_new_passphrase(tmp_path: Path, relay: Relay) -> None:
    path = tmp_path / "solo"
    with VaultSession.open(path, PASSPHRASE, create=True) as session:
        session.link(relay.url, ADMIN_KEY, None, "solo")
    with Vault.open(path, PASSPHRASE) as vault:
        with pytest.raises(RekeyError, match="new passphrase"):
            vault.rekey()
        with pytest.raises(RekeyError, match="is the current one"):
            vault.rekey(PASSPHRASE)
    assert not (path / STATE_FILE).exists()  # the passphrase path: tests/e2e/test_rekey_cli.py


EMAIL, PASSWORD = "rekey@example.org", "the account password of the re-key test"


def _account_vault(tmp_path: Path, relay: Relay, *, owned: bool = True) -> Path:
    """alpha: a passphrase vault of 3 memories whose K the account holds (`vault open`);
    returns bravo, a device that linked it through the account (K source "account").

    `owned`: the account's first key claims the vault id, so the account owns it (PROTOCOL
    §13) and may retire it. Else alpha uses the operator's key first and `vault open`
    adopts the operator's vault, which gives the account an admin grant: not the owner."""
    from engram_sync.client._accounts import account

    alpha = tmp_path / "alpha"
    with VaultSession.open(alpha, PASSPHRASE, create=True) as session:
        key = ADMIN_KEY
        if owned:
            account.signup(session.path, relay.url, EMAIL, PASSWORD)
            with account.unlock(session.path, PASSWORD).client() as c:
                key = c.mint_key("team-account", device_id=None, label="alpha").key
        session.link(relay.url, key, "team-account", "alpha")
        with session.vault.transaction() as conn:
            for i in range(3):
                store.add_memory(conn, f"account memory {i}")
        with session.relay() as client:
            session.syncer(client).sync()
        if not owned:
            account.signup(session.path, relay.url, EMAIL, PASSWORD)
        assert account.open_vault(session, PASSWORD) == "team-account"
    bravo = tmp_path / "bravo"
    with VaultSession.open(bravo, "bravo's own passphrase", create=True) as session:
        account.signin(session.path, relay.url, EMAIL, PASSWORD)
        account.link_with_account(session, relay.url, PASSWORD, label="bravo")
    return bravo


class _StoppedError(Exception):
    """Stands for the process dying right after the mint."""


def test_an_account_rekey_stopped_after_the_mint_finishes_with_the_same_k(
    tmp_path: Path, relay: Relay
) -> None:
    from engram_sync.client._accounts import account
    from engram_sync.client._flows.rekey import account_minter
    from engram_sync.shared_format.b64 import b64decode_std
    from engram_sync.shared_format.wraps import unwrap_vault_key

    bravo = _account_vault(tmp_path, relay)
    with VaultSession.open(bravo, "bravo's own passphrase") as session:
        real = account_minter(session, PASSWORD)
        minted: list[str] = []

        def mint_then_stop(vault_id: str, k: bytes) -> str:
            minted.append(vault_id)
            real(vault_id, k)  # the account holds K's wrap, the key exists
            raise _StoppedError

        with pytest.raises(_StoppedError):
            Rekey(session).run(new_passphrase=None, new_api_key=None, mint_key=mint_then_stop)
        assert session.config.vault_id == "team-account"  # nothing switched yet
        with pytest.raises(RekeyError, match="account's password"):
            Rekey(session).run(new_passphrase=None, new_api_key=None)  # it must mint again
        report = Rekey(session).run(new_passphrase=None, new_api_key=None, mint_key=real)
        assert report.resumed
        assert report.new_vault_id == minted[0]  # the same vault: no other K, no vault left
        assert session.config.vault_id == minted[0]
        new_keys = _keys(session, minted[0])
        unlocked = account.unlock(session.path, PASSWORD)
        with unlocked.client() as client:
            wrap = client.vault_wrap(minted[0])
    k = unwrap_vault_key(b64decode_std(wrap.wrapped_k), unlocked.account_key, minted[0])
    assert (k.enc_key, k.hmac_key) == (new_keys.enc_key, new_keys.hmac_key)  # the same K
    assert report.live == 3
    assert len(_decrypted(relay, minted[0], new_keys)) == 3


def test_a_rekey_by_an_admin_grant_stops_before_the_retire_and_the_owner_finishes(
    tmp_path: Path, relay: Relay
) -> None:
    """PROTOCOL §13 (issue 31 finding 4): only the owner retires a vault. An account with an
    admin grant re-keys into a vault of its own, but the retire of the owner's vault is
    refused (`owner_only`) with what to do; linked with the owner's key, a re-run finishes."""
    from engram_sync.client._flows.rekey import account_minter

    bravo = _account_vault(tmp_path, relay, owned=False)
    with VaultSession.open(bravo, "bravo's own passphrase") as session:
        with pytest.raises(RekeyError, match="owner_only") as refused:
            Rekey(session).run(
                new_passphrase=None,
                new_api_key=None,
                mint_key=account_minter(session, PASSWORD),
            )
        assert "link this device with an owner's admin key" in str(refused.value)
        assert session.config.vault_id == "team-account"  # not switched
    with RelayClient(relay.url, ADMIN_KEY) as client:  # and not retired
        assert isinstance(client.pull("team-account", cursor=0, limit=1).retired, UnsetType)
    with VaultSession.open(bravo, "bravo's own passphrase") as session:
        session.link(relay.url, ADMIN_KEY, "team-account", "bravo")  # the operator owns it
        report = Rekey(session).run(new_passphrase=None, new_api_key=None)
        assert report.resumed
        assert session.config.vault_id == report.new_vault_id
    with RelayClient(relay.url, ADMIN_KEY) as client:
        retired = client.pull("team-account", cursor=0, limit=1).retired
    assert not isinstance(retired, UnsetType)
    assert retired.successor == report.new_vault_id


def test_an_account_vault_stores_the_new_wrap_and_mints_its_key(
    tmp_path: Path, relay: Relay
) -> None:
    from engram_sync.client._accounts import account
    from engram_sync.client._flows.rekey import account_minter
    from engram_sync.shared_format.b64 import b64decode_std
    from engram_sync.shared_format.wraps import unwrap_vault_key

    email, password = EMAIL, PASSWORD
    bravo = _account_vault(tmp_path, relay)
    with VaultSession.open(bravo, "bravo's own passphrase") as session:
        old_key = session.config.api_key
        with session.relay() as client:
            session.syncer(client).sync()
        before = _decrypted(relay, "team-account", _keys(session, "team-account"))

        report = Rekey(session).run(
            new_passphrase=None, new_api_key=None, mint_key=account_minter(session, password)
        )

        assert report.kind == "random"
        new_id = report.new_vault_id
        assert session.config.vault_id == new_id
        assert session.config.api_key not in (None, old_key, ADMIN_KEY)  # minted for it
        new_keys = _keys(session, new_id)
        unlocked = account.unlock(session.path, password)
        with unlocked.client() as client:
            wrap = client.vault_wrap(new_id)
    assert report.live == 3
    assert _decrypted(relay, new_id, new_keys) == before
    k = unwrap_vault_key(b64decode_std(wrap.wrapped_k), unlocked.account_key, new_id)
    assert (k.enc_key, k.hmac_key) == (new_keys.enc_key, new_keys.hmac_key)
    with RelayClient(relay.url, ADMIN_KEY) as client:
        retired = client.pull("team-account", cursor=0, limit=1).retired
    assert not isinstance(retired, UnsetType)
    assert retired.successor == new_id
    charlie = tmp_path / "charlie"  # another device of the person gets the new K
    with VaultSession.open(charlie, "charlie's own passphrase", create=True) as session:
        account.signin(session.path, relay.url, email, password)
        assert account.link_with_account(session, relay.url, password, new_id) == new_id
        with session.relay() as client:
            session.syncer(client).sync()
        assert len(store.list_memories(session.vault.conn)) == 3


def test_the_batched_rows_read_as_row_to_plaintext_plus_waiting_links(tmp_path: Path) -> None:
    from engram_sync.client._vault.store import memories_of_rows
    from engram_sync.shared_format.plaintext import Link

    with VaultSession.open(tmp_path / "v", PASSPHRASE, create=True) as session:
        conn = session.vault.conn
        with session.vault.transaction() as tx:
            a = store.add_memory(tx, "a", tags=["x", "y"], project="p")
            b = store.add_memory(tx, "b")
            c = store.add_memory(tx, "c")
            tx.execute(
                "INSERT INTO engram_links (source_id, target_id, weight, link_type)"
                " VALUES (?, ?, 0.7, 'causal'), (?, ?, 0.2, 'temporal')",
                (a, c, a, b),
            )
            tx.execute(
                "INSERT INTO sync_pending_links (source_id, target_id, link_type, weight)"
                " VALUES (?, 'mem_not_here', 'associative', 0.5)",
                (a,),
            )
            tx.execute(
                "INSERT INTO engram_embeddings (engram_id, embedding, model, dimensions,"
                " created_at) VALUES (?, ?, 'm', 2, '2026-01-01T00:00:00+00:00')",
                (b, bytes(16)),
            )
        rows = [r for r in (store.get_row(conn, i) for i in (a, b, c)) if r is not None]
        batched = memories_of_rows(conn, rows)
        single = [store.row_to_plaintext(conn, row) for row in rows]
    assert batched[1:] == single[1:]  # b (embedding) and c (nothing) as row_to_plaintext
    waiting = Link(link_type="associative", target_id="mem_not_here", weight=0.5)
    assert batched[0].links == sorted([*single[0].links, waiting], key=lambda x: x.target_id)
    assert len(batched[0].links) == 3
    assert [m.id for m in batched] == [a, b, c]
