"""The team key handoff on the device side (PROTOCOL §14).

New device (holds a key for the vault, not K): :func:`request_key` makes an
ephemeral P-256 pair, posts the public key, shows its fingerprint, waits for
an admin's seal, claims it once and keeps K in the local vault. The private key
is kept in the encrypted vault database (`sync_handoff_request`) while the
request lives, so a restarted command resumes the same request.

Admin device (holds K and an admin key): :func:`pending` lists requests with
fingerprints computed here from each public key, and :func:`approve` seals
this device's own K to the request after the person confirmed the fingerprint.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from client.account_client import AccountClient
from client.errors import ForbiddenError, RelayError, SyncError
from client.session import VaultSession
from client.vault_keys import pack_keys, store_vault_key, stored_vault_key, verify_keys_on_relay
from shared_format.errors import HandoffError
from shared_format.handoff import (
    HandoffKeyPair,
    decode_public_key,
    new_handoff_keypair,
    open_handoff_wire,
    public_key_fingerprint,
    seal_vault_key,
)
from shared_format.timestamps import parse_rfc3339, utc_now_rfc3339

DEFAULT_WAIT_SECS: Final = 900.0
POLL_SECS: Final = 2.0


class TeamError(SyncError):
    """A handoff step failed; the message says what to do."""


@dataclass(frozen=True)
class PendingRequest:
    """One open request, as the admin compares it (fingerprint computed here)."""

    request_id: str
    label: str
    fingerprint: str
    created_at: str
    expires_at: str
    public_key: str


@dataclass(frozen=True)
class Waiting:
    """What the new device shows while it waits: compare `fingerprint` with the admin."""

    request_id: str
    fingerprint: str
    expires_at: str
    resumed: bool


def _linked(session: VaultSession) -> tuple[str, str, str]:
    config = session.config
    if not config.vault_id or not config.server_url or not config.api_key:
        raise TeamError(
            "this vault is not linked to a relay: run `engram-sync link --relay URL --code CODE`"
        )
    return config.server_url, config.api_key, config.vault_id


def _client(session: VaultSession) -> AccountClient:
    server_url, api_key, _ = _linked(session)
    return AccountClient(server_url, api_key, device_id=session.device.device_id)


# --- the requester's side ---------------------------------------------------------------------


def _saved_request(
    conn: sqlite3.Connection, server_url: str, vault_id: str
) -> tuple[str, HandoffKeyPair, str] | None:
    row = conn.execute(
        "SELECT request_id, private_key, expires_at FROM sync_handoff_request"
        " WHERE server_url = ? AND vault_id = ? ORDER BY created_at DESC LIMIT 1",
        (server_url, vault_id),
    ).fetchone()
    if row is None:
        return None
    private = serialization.load_der_private_key(bytes(row[1]), password=None)
    if not isinstance(private, ec.EllipticCurvePrivateKey):
        return None
    return str(row[0]), HandoffKeyPair.from_private_key(private), str(row[2])


def _forget_requests(conn: sqlite3.Connection, vault_id: str) -> None:
    conn.execute("DELETE FROM sync_handoff_request WHERE vault_id = ?", (vault_id,))


def _start(session: VaultSession, relay: AccountClient, label: str) -> Waiting:
    server_url, _, vault_id = _linked(session)
    keypair = new_handoff_keypair()
    created = relay.handoff_request(vault_id, keypair.public_key_b64url, label)
    if created.fingerprint != keypair.fingerprint:
        relay.handoff_cancel(vault_id, created.request_id)
        raise TeamError(
            "the relay reports another fingerprint than this device's key: it may be "
            "substituting keys; the request was withdrawn, do not approve it"
        )
    private = keypair.private_key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),  # the vault database is encrypted (SQLCipher)
    )
    with session.vault.transaction() as conn:
        _forget_requests(conn, vault_id)
        conn.execute(
            "INSERT INTO sync_handoff_request (request_id, server_url, vault_id, private_key,"
            " fingerprint, label, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                created.request_id,
                server_url,
                vault_id,
                private,
                keypair.fingerprint,
                label,
                utc_now_rfc3339(),
                created.expires_at,
            ),
        )
    return Waiting(created.request_id, keypair.fingerprint, created.expires_at, resumed=False)


def request_key(
    session: VaultSession,
    label: str | None = None,
    *,
    wait: float = DEFAULT_WAIT_SECS,
    poll: float = POLL_SECS,
    on_waiting: Callable[[Waiting], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Ask an admin for K (or resume the open request) and keep it; returns the vault id.

    `on_waiting` is called once with the fingerprint to show. TeamError when no
    admin sealed it within `wait` seconds (the request stays open: run again to
    resume), when it expired, or when the seal does not open or is not for this vault.
    """
    server_url, _, vault_id = _linked(session)
    if stored_vault_key(session.vault.conn, vault_id) is not None:
        raise TeamError(f"this device already holds the key of vault {vault_id}")
    label = label or session.device.label
    with _client(session) as relay:
        saved = _saved_request(session.vault.conn, server_url, vault_id)
        waiting: Waiting | None = None
        keypair: HandoffKeyPair | None = None
        if saved is not None:
            request_id, keypair, expires_at = saved
            try:
                state = relay.handoff_status(vault_id, request_id).status
            except RelayError as exc:
                if exc.status not in (403, 404):
                    raise
                state = "gone"
            if state in ("pending", "sealed"):
                waiting = Waiting(request_id, keypair.fingerprint, expires_at, resumed=True)
            else:
                with session.vault.transaction() as conn:
                    _forget_requests(conn, vault_id)
        if waiting is None:
            try:
                waiting = _start(session, relay, label)
            except ForbiddenError as exc:
                raise TeamError(f"the relay refused the request: {exc.message}") from None
            saved = _saved_request(session.vault.conn, server_url, vault_id)
            assert saved is not None
            keypair = saved[1]
        assert keypair is not None
        if on_waiting is not None:
            on_waiting(waiting)
        _wait_for_seal(relay, vault_id, waiting, wait, poll, sleep)
        try:
            claimed = relay.handoff_claim(vault_id, waiting.request_id)
        except RelayError as exc:
            if exc.status == 410:
                with session.vault.transaction() as conn:
                    _forget_requests(conn, vault_id)
                raise TeamError(
                    "this request was already claimed or expired: run `engram-sync team "
                    "request` again"
                ) from None
            raise
    try:
        key = open_handoff_wire(keypair, claimed.public_key, claimed.sealed, vault_id)
    except HandoffError as exc:
        with session.vault.transaction() as conn:
            _forget_requests(conn, vault_id)
        raise TeamError(
            f"the sealed key was refused ({exc}); nothing was stored: run `engram-sync team "
            "request` again and compare the fingerprint carefully"
        ) from None
    with session.vault.transaction() as conn:
        store_vault_key(conn, key, "handoff")
        _forget_requests(conn, vault_id)
    session._keys = None
    return vault_id


def _wait_for_seal(
    relay: AccountClient,
    vault_id: str,
    waiting: Waiting,
    wait: float,
    poll: float,
    sleep: Callable[[float], None],
) -> None:
    deadline = time.monotonic() + wait
    while True:
        state = relay.handoff_status(vault_id, waiting.request_id).status
        if state == "sealed":
            return
        if state != "pending":
            raise TeamError(
                f"this request is {state}: run `engram-sync team request` again for a new one"
            )
        if time.monotonic() >= deadline:
            until = parse_rfc3339(waiting.expires_at).strftime("%H:%M UTC")
            raise TeamError(
                f"no admin approved request {waiting.request_id} yet; it stays open until "
                f"{until}: run `engram-sync team request` again to keep waiting"
            )
        sleep(max(0.0, min(poll, deadline - time.monotonic())))


# --- the admin's side -------------------------------------------------------------------------


def _admin_only(exc: ForbiddenError) -> TeamError:
    return TeamError(
        f"this needs an admin key for the vault, and this device's key is not one ({exc.message})"
    )


def pending(session: VaultSession) -> list[PendingRequest]:
    """Open requests of the linked vault (admin key), fingerprints computed on this device."""
    _, _, vault_id = _linked(session)
    with _client(session) as relay:
        try:
            listed = relay.handoff_pending(vault_id)
        except ForbiddenError as exc:
            raise _admin_only(exc) from None
    found = []
    for r in listed.requests:
        try:
            fingerprint = public_key_fingerprint(decode_public_key(r.public_key))
        except HandoffError:
            fingerprint = "INVALID-PUBLIC-KEY"
        found.append(
            PendingRequest(
                r.request_id, r.label, fingerprint, r.created_at, r.expires_at, r.public_key
            )
        )
    return found


def find_pending(session: VaultSession, request_id: str) -> PendingRequest:
    """One open request by id; TeamError naming `team pending` otherwise."""
    for request in pending(session):
        if request.request_id == request_id:
            if request.fingerprint == "INVALID-PUBLIC-KEY":
                raise TeamError(f"request {request_id} carries an invalid public key: refuse it")
            return request
    raise TeamError(
        f"no open request {request_id}: `engram-sync team pending` lists them (a request "
        "lives 15 minutes)"
    )


def approve(session: VaultSession, request: PendingRequest) -> None:
    """Seal this device's K to `request` (call only after the fingerprint was confirmed)."""
    _, _, vault_id = _linked(session)
    keys = session.keys
    with _client(session) as relay:
        verify_keys_on_relay(relay, vault_id, keys)
        sealed = seal_vault_key(decode_public_key(request.public_key), pack_keys(keys, vault_id))
        wire = sealed.to_wire()
        try:
            relay.handoff_seal(vault_id, request.request_id, wire["public_key"], wire["sealed"])
        except ForbiddenError as exc:
            raise _admin_only(exc) from None
        except RelayError as exc:
            if exc.status in (404, 409, 410):
                raise TeamError(
                    f"cannot approve request {request.request_id}: {exc.message}"
                ) from None
            raise
