"""Pairing codes on the device side: an admin issues `ENG-XXXX-XXXX-XXXX-SSSS-SSSS`, a new
device redeems it for its own device-bound key (our addition; PROTOCOL §14 step 4).

The relay makes and redeems the first part; the secret part `SSSS-SSSS` is made
here, on the admin's device, and never sent (shared_format.pairing). Both the
admin's and the new device keep the whole code in the encrypted vault database
(`sync_pairing_code`, one owner: this module) so that the handoff of K
(client._accounts.team) is authenticated by it: the admin's device finds the code by the
request's `pairing_id`, uses it for one exchange and forgets it. A code without
the secret part (`engram-relay pair`) still redeems; the handoff then goes by
fingerprints.

A code gives a device access to the vault's ciphertext, not K: after redeeming,
the vault is marked as waiting for its key (client._vault.vault_key_store), and the device
asks for K with `engram-sync team request` (client._accounts.team).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Final, Literal

from engram_sync.shared_format.pairing import (
    PairingCode,
    PairingCodeError,
    new_pairing_secret,
    parse_pairing_code,
    with_secret,
)
from engram_sync.shared_format.timestamps import utc_now_rfc3339
from engram_sync.shared_format.vault import VaultKeyKind
from engram_sync.shared_format.wire import PairingRedeemed

from .._errors import ForbiddenError, RelayError, SyncError
from .._http.account_client import AccountClient
from .._session import VaultSession
from .._sync.config import SyncConfig, save_sync_config
from .._vault.vault_key_store import expect_vault_key, stored_vault_key

CODE_INVALID = "this pairing code is invalid, used or expired: ask the admin for a new one"
# How long a whole code is kept for its handoff: the relay part lives 10 minutes, a
# request made with it 15 more; a day leaves room for a slow new device.
KEEP_CODE_SECS: Final = 86400.0
Role = Literal["admin", "requester"]


@dataclass(frozen=True)
class Invitation:
    """A code issued for a new device: `code` is the whole code, shown once."""

    code: str
    vault_id: str
    expires_at: str
    label: str | None
    device_bound: bool


class PairingError(SyncError):
    """A pairing step failed; the message says what to do."""


def require_passphrase_vault(session: VaultSession) -> None:
    """A vault key is kept only in a passphrase-encrypted vault."""
    if session.vault.key_kind is not VaultKeyKind.PASSPHRASE:
        raise PairingError(
            "this vault is protected only by the machine key, so it cannot hold a vault key: "
            "make a passphrase vault with `engram-sync init`"
        )


def save_link(session: VaultSession, server_url: str, api_key: str, vault_id: str) -> None:
    """Point the session's vault at (relay, vault) with `api_key`, as `link` does."""
    session.config = SyncConfig(
        enabled=True,
        server_url=server_url.rstrip("/"),
        api_key=api_key,
        vault_id=vault_id,
        interval_secs=session.config.interval_secs,
    )
    save_sync_config(session.path, session.config)
    session.state.bind(session.config.server_url or "", vault_id)
    session.state.relinked()  # the next sync asks the relay again (client._sync.revocation)
    session.forget_keys()  # the linked vault changed: pick its keys again


# --- the whole codes this device keeps (PROTOCOL §14 step 4) ------------------------------


def _purge(conn: sqlite3.Connection) -> None:
    conn.execute("DELETE FROM sync_pairing_code WHERE keep_until < ?", (time.time(),))


def remember_code(
    conn: sqlite3.Connection, code: PairingCode, role: Role, server_url: str, vault_id: str
) -> None:
    """Keep a whole code (it must have its secret part) for the handoff it authenticates.

    A new device keeps one code per vault: a newer one replaces it.
    """
    if code.secret is None:
        raise ValueError("only a code with its secret part authenticates a handoff")
    _purge(conn)
    if role == "requester":
        conn.execute(
            "DELETE FROM sync_pairing_code WHERE role = 'requester' AND vault_id = ?", (vault_id,)
        )
    conn.execute(
        "INSERT OR REPLACE INTO sync_pairing_code (pairing_id, role, server_url, vault_id, code,"
        " created_at, keep_until) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            code.pairing_id,
            role,
            server_url.rstrip("/"),
            vault_id,
            code.full,
            utc_now_rfc3339(),
            time.time() + KEEP_CODE_SECS,
        ),
    )


def _code(row: tuple[object, ...] | None) -> PairingCode | None:
    return None if row is None else parse_pairing_code(str(row[0]))


def admin_code(
    conn: sqlite3.Connection, pairing_id: str, server_url: str, vault_id: str
) -> PairingCode | None:
    """The code this device issued with `pairing_id` for (relay, vault), if it still has it."""
    _purge(conn)
    row = conn.execute(
        "SELECT code FROM sync_pairing_code WHERE role = 'admin' AND pairing_id = ?"
        " AND server_url = ? AND vault_id = ?",
        (pairing_id, server_url.rstrip("/"), vault_id),
    ).fetchone()
    return _code(row)


def requester_code(conn: sqlite3.Connection, server_url: str, vault_id: str) -> PairingCode | None:
    """The code this device was linked with for (relay, vault), if it still has it."""
    _purge(conn)
    row = conn.execute(
        "SELECT code FROM sync_pairing_code WHERE role = 'requester' AND server_url = ?"
        " AND vault_id = ? ORDER BY created_at DESC LIMIT 1",
        (server_url.rstrip("/"), vault_id),
    ).fetchone()
    return _code(row)


def forget_code(conn: sqlite3.Connection, pairing_id: str, role: Role) -> None:
    """Drop a kept code (used once, or given up)."""
    conn.execute(
        "DELETE FROM sync_pairing_code WHERE pairing_id = ? AND role = ?", (pairing_id, role)
    )


def forget_requester_codes(conn: sqlite3.Connection, vault_id: str) -> None:
    """Drop every code this device was linked with for `vault_id`."""
    conn.execute(
        "DELETE FROM sync_pairing_code WHERE role = 'requester' AND vault_id = ?", (vault_id,)
    )


# --- issuing and redeeming ----------------------------------------------------------------


def issue_code(
    session: VaultSession, label: str | None = None, *, session_token: str | None = None
) -> Invitation:
    """A pairing code for the linked vault: with this device's API key if it is an admin
    key, else with `session_token` (the session of an account that owns the vault).

    The relay issues the first part; the secret part is made here and kept with it
    in the vault database (PROTOCOL §14 step 4) before the whole code is returned.
    """
    vault_id = session.config.vault_id
    server_url = session.config.server_url
    if not vault_id or not server_url:
        raise PairingError("this vault is not linked to a relay: run `engram-sync link` first")
    bearers = [b for b in (session.config.api_key, session_token) if b]
    for bearer in bearers:
        with AccountClient(server_url, bearer) as relay:
            try:
                issued = relay.create_pairing_code(vault_id, label)
            except ForbiddenError:
                continue
        code = with_secret(issued.code, new_pairing_secret())
        with session.vault.transaction() as conn:
            remember_code(conn, code, "admin", server_url, vault_id)
        return Invitation(
            code=code.full,
            vault_id=issued.vault_id,
            expires_at=issued.expires_at,
            label=issued.label,
            device_bound=issued.device_bound,
        )
    raise PairingError(
        "issuing a pairing code needs an admin key for this vault or the session of an account "
        "that holds its key (`engram-sync vault open`); this device has neither"
    )


def _redeem(
    session: VaultSession, server_url: str, relay_code: str, label: str | None
) -> PairingRedeemed:
    device_id = session.device.device_id
    with AccountClient(server_url, None, device_id=device_id) as relay:
        try:
            return relay.redeem_pairing_code(relay_code, device_id, label)
        except RelayError as exc:
            if exc.code == "code_invalid":
                raise PairingError(CODE_INVALID) from None
            raise


def link_with_code(
    session: VaultSession, server_url: str, code: str, label: str | None = None
) -> tuple[str, bool]:
    """Redeem `code` for this device and link to its vault.

    Only the code's first part is sent; a secret part is kept for the handoff
    (PROTOCOL §14 step 4). Returns (vault_id, has_key): has_key is False until K
    arrives by a handoff.
    """
    require_passphrase_vault(session)
    try:
        parsed = parse_pairing_code(code)
    except PairingCodeError as exc:
        raise PairingError(f"{exc}: check the code the admin gave you") from None
    if label:
        session.device.label = label
        session.device.save()
    if session.state.revoked:  # issue 31: the relay revoked this id; pair under a new one
        session.renew_device_id()
    try:
        redeemed = _redeem(session, server_url, parsed.relay_code, label)
    except RelayError as exc:
        if exc.code != "device_revoked":
            raise
        # issue 31 (client._sync.revocation): the relay keeps this id revoked, and a refused
        # redeem leaves the code unused: pair under a new device id, once
        session.renew_device_id()
        redeemed = _redeem(session, server_url, parsed.relay_code, label)
    with session.vault.transaction() as conn:
        has_key = stored_vault_key(conn, redeemed.vault_id) is not None
        if not has_key:
            expect_vault_key(conn, redeemed.vault_id, "handoff")
            if parsed.secret is not None:
                remember_code(conn, parsed, "requester", server_url, redeemed.vault_id)
            else:
                forget_requester_codes(conn, redeemed.vault_id)
    save_link(session, server_url, redeemed.api_key, redeemed.vault_id)
    return redeemed.vault_id, has_key
