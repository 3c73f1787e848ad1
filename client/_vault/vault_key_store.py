"""The vault key K kept on this device, inside the encrypted vault database (our addition).

A device that got K from the account (`link --account`) or a team handoff has
no sync passphrase: its sync keys are K itself. K (enc_key ‖ hmac_key ‖
vault_id, PROTOCOL §13) is kept in the local-only table `sync_vault_key`, so
SQLCipher protects it like the memories; the vault itself stays keyed by the
person's own local passphrase, which need not be the team's. The session's sync
keys come from a stored K for the linked vault id (its vault_id suffix checked)
and otherwise from the passphrase (PROTOCOL §2).

`sync_vault_key_expected` marks a vault whose key must come from elsewhere
(a device linked by a pairing code): until K arrives, sync refuses to derive
keys from the local passphrase, which would encrypt under the wrong keys.
`sync_handoff_request` keeps the ephemeral private key of an open team handoff
request (client._accounts.team), so a restarted command resumes it; `sync_handoff_pake` the
SPAKE2 state of such a request made with a pairing code, and `sync_pairing_code`
the whole pairing codes (with their secret part, PROTOCOL §14 step 4) this device
issued as an admin or redeemed as a new device (client._accounts.pairing). All of them are
as secret as K and live only in this encrypted database; client._vault.schema
creates and migrates them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Final

from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.errors import BlobTamperedError, KeyUnwrapError
from engram_sync.shared_format.sync_keys import SyncKeys, derive_sync_keys
from engram_sync.shared_format.timestamps import utc_now_rfc3339
from engram_sync.shared_format.wire import SyncBlob
from engram_sync.shared_format.wraps import VaultKey, pack_vault_key, unpack_vault_key

from .._errors import SyncError
from .._http.relay_client import RelayClient

BLOB_SAMPLE: Final = 20
SOURCES: Final = ("account", "handoff", "passphrase")


class VaultKeyMissingError(SyncError):
    """This device has no key for its linked vault yet (it waits for a handoff)."""


class KeysDoNotOpenVaultError(SyncError):
    """The vault holds blobs and this device's sync keys open none of them (issue 35): a
    mistyped passphrase, or a member device still waiting for the team key K."""


def pack_keys(keys: SyncKeys, vault_id: str) -> bytes:
    """K of a vault whose sync keys this device holds."""
    return pack_vault_key(keys.enc_key, keys.hmac_key, vault_id)


def store_vault_key(conn: sqlite3.Connection, k: bytes | VaultKey, source: str) -> VaultKey:
    """Keep K (replacing any older one for its vault); clears a pending expectation."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}")
    if isinstance(k, VaultKey):
        k = pack_vault_key(k.enc_key, k.hmac_key, k.vault_id)
    key = unpack_vault_key(k, None)
    conn.execute(
        "INSERT INTO sync_vault_key (vault_id, k, source, stored_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (vault_id) DO UPDATE SET k = excluded.k, source = excluded.source,"
        " stored_at = excluded.stored_at",
        (key.vault_id, k, source, utc_now_rfc3339()),
    )
    conn.execute("DELETE FROM sync_vault_key_expected WHERE vault_id = ?", (key.vault_id,))
    return key


def stored_vault_key(conn: sqlite3.Connection, vault_id: str) -> VaultKey | None:
    """The stored K of `vault_id`, checked against it; None when there is none."""
    row = conn.execute("SELECT k FROM sync_vault_key WHERE vault_id = ?", (vault_id,)).fetchone()
    if row is None:
        return None
    try:
        return unpack_vault_key(bytes(row[0]), vault_id)
    except KeyUnwrapError as exc:
        raise SyncError(
            f"the vault key stored on this device for {vault_id} is unusable ({exc}); "
            "link the vault again"
        ) from None


def forget_vault_key(conn: sqlite3.Connection, vault_id: str) -> bool:
    """Drop the stored K of a vault; True if there was one."""
    cursor = conn.execute("DELETE FROM sync_vault_key WHERE vault_id = ?", (vault_id,))
    return cursor.rowcount > 0


def expect_vault_key(conn: sqlite3.Connection, vault_id: str, source: str) -> None:
    """Mark `vault_id` as keyed from `source`, not from the passphrase, until K is stored."""
    conn.execute(
        "INSERT OR REPLACE INTO sync_vault_key_expected (vault_id, source, since) VALUES (?, ?, ?)",
        (vault_id, source, utc_now_rfc3339()),
    )


def clear_expected(conn: sqlite3.Connection, vault_id: str) -> None:
    """The passphrase keys this vault after all (e.g. linked again with an API key)."""
    conn.execute("DELETE FROM sync_vault_key_expected WHERE vault_id = ?", (vault_id,))


def key_source(conn: sqlite3.Connection, vault_id: str | None) -> str:
    """Where this device's sync keys for `vault_id` come from: a SOURCES value or `missing`."""
    if vault_id is None:
        return "passphrase"
    row = conn.execute(
        "SELECT source FROM sync_vault_key WHERE vault_id = ?", (vault_id,)
    ).fetchone()
    if row is not None:
        return str(row[0])
    waiting = conn.execute(
        "SELECT 1 FROM sync_vault_key_expected WHERE vault_id = ?", (vault_id,)
    ).fetchone()
    return "missing" if waiting is not None else "passphrase"


def session_sync_keys(
    conn: sqlite3.Connection, vault_id: str | None, passphrase: str | SyncKeys
) -> SyncKeys:
    """The sync keys: a stored K for `vault_id`, else derived from the passphrase (§2), or
    the passphrase's keys as the key agent holds them (docs/agent.md).

    VaultKeyMissingError when the vault expects a key from a handoff that has not come.
    """
    if vault_id is not None:
        stored = stored_vault_key(conn, vault_id)
        if stored is not None:
            return SyncKeys(enc_key=stored.enc_key, hmac_key=stored.hmac_key)
        if key_source(conn, vault_id) == "missing":
            raise VaultKeyMissingError(
                f"this device has no key for vault {vault_id} yet: run `engram-sync team "
                "request` and have an admin approve it with `engram-sync team approve`"
            )
    return passphrase if isinstance(passphrase, SyncKeys) else derive_sync_keys(passphrase)


def keys_open_blobs(keys: SyncKeys, blobs: Sequence[SyncBlob]) -> bool | None:
    """Whether `keys` verify (PROTOCOL §3 HMAC) any of `blobs`; None when there are none.

    One good blob is enough (another blob may be damaged or foreign and skipped), so a
    False is a strong sign that these are not the vault's keys."""
    if not blobs:
        return None
    cipher = BlobCipher(keys)
    for blob in blobs:
        try:
            cipher.verify(blob)
        except BlobTamperedError:
            continue
        return True
    return False


def keys_refused_message(
    vault_id: str, source: str, outcome: str = "nothing was pulled or pushed"
) -> str:
    """One line for a device whose keys open none of the vault's blobs (issue 35)."""
    if source == "passphrase":
        return (
            f"this passphrase does not open vault {vault_id}'s memories: a typo? (`engram-sync "
            "init` a new vault with the right one) or, for a team vault, get its key with "
            f"`engram-sync team request`; {outcome}"
        )
    return (
        f"the vault key this device got by {source} does not open vault {vault_id}'s "
        f"memories: {outcome}; ask an admin of the vault"
    )


def keys_open_relay_blobs(
    relay: RelayClient, vault_id: str, keys: SyncKeys, sample: int = BLOB_SAMPLE
) -> bool | None:
    """Whether `keys` verify (PROTOCOL §3 HMAC) any of the vault's oldest `sample` blobs on
    the relay; None when the vault holds no blobs there.

    One good blob is enough (another blob may be damaged or foreign and skipped), so a
    False is a strong sign that these are not the vault's keys.
    """
    return keys_open_blobs(keys, relay.pull(vault_id, cursor=0, limit=sample).blobs)


def verify_keys_on_relay(relay: RelayClient, vault_id: str, keys: SyncKeys) -> None:
    """Check `keys` against the vault's oldest blobs (when it has any) before sharing them.

    SyncError when none of them verifies: these are not the vault's keys (another
    passphrase), and handing them on would only spread unreadable blobs.
    """
    if keys_open_relay_blobs(relay, vault_id, keys) is False:
        raise SyncError(
            f"this device's sync keys do not open the blobs of vault {vault_id} on the relay "
            "(another passphrase?); refusing to hand them on"
        )
