"""Pairing codes on the device side: an admin issues `ENG-XXXX-XXXX-XXXX`, a new device
redeems it for its own device-bound key (our addition).

A code gives a device access to the vault's ciphertext, not K: after redeeming,
the vault is marked as waiting for its key (client.vault_keys), and the device
asks for K with `engram-sync team request` (client.team).
"""

from __future__ import annotations

from client.account_client import AccountClient
from client.errors import ForbiddenError, RelayError, SyncError
from client.session import VaultSession
from client.sync_config import SyncConfig, save_sync_config
from client.vault_keys import expect_vault_key, stored_vault_key
from shared_format.pairing import PairingCodeError, normalize_pairing_code
from shared_format.vault import VaultKeyKind
from shared_format.wire import PairingCodeIssued

CODE_INVALID = "this pairing code is invalid, used or expired: ask the admin for a new one"


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
    session._keys = None  # the linked vault changed: pick its keys again


def issue_code(
    session: VaultSession, label: str | None = None, *, session_token: str | None = None
) -> PairingCodeIssued:
    """A pairing code for the linked vault: with this device's API key if it is an admin
    key, else with `session_token` (the session of an account that owns the vault)."""
    vault_id = session.config.vault_id
    server_url = session.config.server_url
    if not vault_id or not server_url:
        raise PairingError("this vault is not linked to a relay: run `engram-sync link` first")
    bearers = [b for b in (session.config.api_key, session_token) if b]
    for bearer in bearers:
        with AccountClient(server_url, bearer) as relay:
            try:
                return relay.create_pairing_code(vault_id, label)
            except ForbiddenError:
                continue
    raise PairingError(
        "issuing a pairing code needs an admin key for this vault or the session of an account "
        "that holds its key (`engram-sync vault open`); this device has neither"
    )


def link_with_code(
    session: VaultSession, server_url: str, code: str, label: str | None = None
) -> tuple[str, bool]:
    """Redeem `code` for this device and link to its vault.

    Returns (vault_id, has_key): has_key is False until K arrives by a handoff.
    """
    require_passphrase_vault(session)
    try:
        code = normalize_pairing_code(code)
    except PairingCodeError as exc:
        raise PairingError(f"{exc}: check the code the admin gave you") from None
    if label:
        session.device.label = label
        session.device.save()
    with AccountClient(server_url, None, device_id=session.device.device_id) as relay:
        try:
            redeemed = relay.redeem_pairing_code(code, session.device.device_id, label)
        except RelayError as exc:
            if exc.code == "code_invalid":
                raise PairingError(CODE_INVALID) from None
            if exc.code == "device_revoked":
                raise PairingError(
                    "this device was revoked for that vault: it cannot be paired again"
                ) from None
            raise
    with session.vault.transaction() as conn:
        has_key = stored_vault_key(conn, redeemed.vault_id) is not None
        if not has_key:
            expect_vault_key(conn, redeemed.vault_id, "handoff")
    save_link(session, server_url, redeemed.api_key, redeemed.vault_id)
    return redeemed.vault_id, has_key
