"""A vault session from the agent's keys, and the keys `unlock` hands to the agent.

Imported by the CLI only (it brings the vault session in); asking the agent itself is
client._agent.control.
"""

from __future__ import annotations

from pathlib import Path

from engram_sync.shared_format.errors import VaultError
from engram_sync.shared_format.sync_keys import SyncKeys, derive_sync_keys
from engram_sync.shared_format.vault import (
    VaultKeyKind,
    machine_vault_key,
    passphrase_vault_key,
    read_machine_id,
    vault_salt16,
)

from .._session import VaultSession
from . import control
from .messages import HeldKeys


def sync_keys_of(keys: HeldKeys) -> SyncKeys | None:
    """The sync keys the agent holds (None for a machine-key vault)."""
    if keys.enc_key is None or keys.hmac_key is None:
        return None
    return SyncKeys(enc_key=bytes.fromhex(keys.enc_key), hmac_key=bytes.fromhex(keys.hmac_key))


def unlocked_session(vault_dir: Path) -> VaultSession | None:
    """The vault opened with the agent's keys; None when there is no agent, it holds no
    keys for this vault, or they no longer open it (then it is told to forget them)."""
    keys = control.held_keys(vault_dir)
    if keys is None:
        return None
    try:
        session = VaultSession.open_with_keys(vault_dir, keys.db_key, sync_keys_of(keys))
    except (VaultError, ValueError):
        session = None  # a key of the wrong shape, a database that went away
    if session is None:
        control.forget(vault_dir)  # stale (the passphrase changed): ask for it again
    return session


def _database_key(session: VaultSession, passphrase: str) -> str:
    """The key string the open vault answers to (VAULT §2)."""
    if session.vault.key_kind is VaultKeyKind.MACHINE:
        return machine_vault_key(read_machine_id())
    return passphrase_vault_key(passphrase, vault_salt16(session.path))


def derive_keys(vault_dir: Path, passphrase: str) -> HeldKeys:
    """The keys of `vault_dir` for the agent, after the passphrase opened it:
    WrongPassphraseError (nothing derived is kept) when it does not.

    The database key is derived first and tried alone (one Argon2id); a vault it does not
    open takes the full VAULT §2 order (legacy, then rekeyed; the machine key).
    """
    db_key = passphrase_vault_key(passphrase, vault_salt16(vault_dir))
    trial = VaultSession.open_with_keys(vault_dir, db_key, None)
    if trial is not None:
        trial.close()  # the passphrase's current key opens it: a passphrase vault
        machine = False
    else:
        with VaultSession.open(vault_dir, passphrase) as session:
            machine = session.vault.key_kind is VaultKeyKind.MACHINE
            db_key = _database_key(session, passphrase)
    if machine:
        return HeldKeys(db_key=db_key)
    sync = derive_sync_keys(passphrase)  # PROTOCOL §2, both in parallel
    return HeldKeys(db_key=db_key, enc_key=sync.enc_key.hex(), hmac_key=sync.hmac_key.hex())
