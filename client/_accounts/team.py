"""The team key handoff on the device side (PROTOCOL §14).

New device (holds a key for the vault, not K): :func:`request_key` makes an
ephemeral P-256 pair, posts the public key, shows its fingerprint, waits for
an admin's seal, claims it once and keeps K in the local vault only once the
sealer is authenticated (§14 step 4). The private key (and the SPAKE2 state)
is kept in the encrypted vault database (`sync_handoff_request`,
`sync_handoff_pake`) while the request lives, so a restarted command resumes it.

Admin device (holds K and an admin key): :func:`pending` lists requests with
fingerprints computed here from each public key, and :func:`approve` seals
this device's own K to the request.

Authenticating the sealer (PROTOCOL §14 step 4; docs/handoff.md):

- *Pairing-code path.* A device linked with a whole code
  (`ENG-XXXX-XXXX-XXXX-SSSS-SSSS`, client._accounts.pairing) posts a SPAKE2 message with
  its request; the admin's device that issued the code finishes the exchange,
  binds the seal to it and authenticates it (shared_format.handoff_pake). No
  fingerprint to compare on either side.
- *Member-request path.* The admin compares the requester's fingerprint before
  sealing; :func:`approve` returns the fingerprint of the admin's ephemeral key,
  which the admin's screen shows, and the requester stores K only after the
  person confirmed it (`confirm`) or a script passed it (`expect`).
- Either way, when the vault already holds blobs on the relay, a K under which
  none of them verifies is refused and nothing is stored.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, NoReturn

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from msgspec import UnsetType

from engram_sync.shared_format.b64 import b64url_encode
from engram_sync.shared_format.errors import HandoffError
from engram_sync.shared_format.handoff import (
    HandoffKeyPair,
    decode_public_key,
    new_handoff_keypair,
    open_handoff_wire,
    public_key_fingerprint,
    seal_vault_key,
)
from engram_sync.shared_format.handoff_pake import (
    SIDE_REQUESTER,
    RequesterPake,
    decode_pake_message,
    open_wire_with_code,
    pake_password,
    seal_vault_key_with_code,
)
from engram_sync.shared_format.pairing import PairingCode
from engram_sync.shared_format.sync_keys import SyncKeys
from engram_sync.shared_format.timestamps import parse_rfc3339, utc_now_rfc3339
from engram_sync.shared_format.wire import HandoffClaimed
from engram_sync.shared_format.wraps import VaultKey

from .._errors import ForbiddenError, RelayError, SyncError
from .._http.account_client import AccountClient
from .._session import VaultSession
from .._vault.vault_key_store import (
    keys_open_relay_blobs,
    pack_keys,
    store_vault_key,
    stored_vault_key,
    verify_keys_on_relay,
)
from . import pairing

DEFAULT_WAIT_SECS: Final = 900.0
POLL_SECS: Final = 2.0
INVALID_FINGERPRINT: Final = "INVALID-PUBLIC-KEY"


class TeamError(SyncError):
    """A handoff step failed; the message says what to do."""


@dataclass(frozen=True)
class PendingRequest:
    """One open request, as the admin compares it (fingerprint computed here).

    `pake` and `pairing_id` are set when the request was made with a pairing code.
    """

    request_id: str
    label: str
    fingerprint: str
    created_at: str
    expires_at: str
    public_key: str
    pake: str | None = None
    pairing_id: str | None = None

    @property
    def by_code(self) -> bool:
        """Made with a pairing code: the code, not a fingerprint, authenticates it."""
        return self.pake is not None


@dataclass(frozen=True)
class Waiting:
    """What the new device shows while it waits: compare `fingerprint` with the admin
    (unless `by_code`: then the pairing code authenticates the request)."""

    request_id: str
    fingerprint: str
    expires_at: str
    resumed: bool
    by_code: bool = False


@dataclass(frozen=True)
class Approval:
    """What the admin's screen shows after sealing: the new device confirms
    `admin_fingerprint` (member-request path; with a code it checks by itself)."""

    request_id: str
    by_code: bool
    admin_fingerprint: str


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


def _given(value: str | UnsetType) -> str | None:
    return None if isinstance(value, UnsetType) else value


def normalize_fingerprint(text: str) -> str:
    """A typed fingerprint in the shown form `XXXX-XXXX-XXXX-XXXX` (case, spaces and
    hyphens are free)."""
    compact = "".join(ch for ch in text.upper() if ch not in " -_\t")
    return "-".join(compact[i : i + 4] for i in range(0, len(compact), 4))


# --- the requester's side ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Saved:
    request_id: str
    keypair: HandoffKeyPair
    expires_at: str
    pake: RequesterPake | None
    pairing_id: str | None


def _saved_request(conn: sqlite3.Connection, server_url: str, vault_id: str) -> _Saved | None:
    row = conn.execute(
        "SELECT r.request_id, r.private_key, r.expires_at, p.state, p.pairing_id"
        " FROM sync_handoff_request r LEFT JOIN sync_handoff_pake p USING (request_id)"
        " WHERE r.server_url = ? AND r.vault_id = ? ORDER BY r.created_at DESC LIMIT 1",
        (server_url, vault_id),
    ).fetchone()
    if row is None:
        return None
    private = serialization.load_der_private_key(bytes(row[1]), password=None)
    if not isinstance(private, ec.EllipticCurvePrivateKey):
        return None
    pake = None if row[3] is None else RequesterPake.from_state(bytes(row[3]))
    return _Saved(
        str(row[0]),
        HandoffKeyPair.from_private_key(private),
        str(row[2]),
        pake,
        None if row[4] is None else str(row[4]),
    )


def _forget_requests(conn: sqlite3.Connection, vault_id: str) -> None:
    conn.execute(
        "DELETE FROM sync_handoff_pake WHERE request_id IN"
        " (SELECT request_id FROM sync_handoff_request WHERE vault_id = ?)",
        (vault_id,),
    )
    conn.execute("DELETE FROM sync_handoff_request WHERE vault_id = ?", (vault_id,))


def _start(
    session: VaultSession, relay: AccountClient, label: str, code: PairingCode | None
) -> Waiting:
    server_url, _, vault_id = _linked(session)
    keypair = new_handoff_keypair()
    pake = None if code is None else RequesterPake.start(pake_password(code))
    created = relay.handoff_request(
        vault_id,
        keypair.public_key_b64url,
        label,
        pake=None if pake is None else b64url_encode(pake.message),
        pairing_id=None if code is None else code.pairing_id,
    )
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
        if pake is not None and code is not None:
            # PROTOCOL §14 step 4: the SPAKE2 state (password and scalar) stays on this device.
            conn.execute(
                "INSERT INTO sync_handoff_pake (request_id, pairing_id, state) VALUES (?, ?, ?)",
                (created.request_id, code.pairing_id, pake.state()),
            )
    return Waiting(
        created.request_id,
        keypair.fingerprint,
        created.expires_at,
        resumed=False,
        by_code=pake is not None,
    )


def _drop_code(session: VaultSession, relay: AccountClient, server_url: str, vault_id: str) -> None:
    """`use_code=False`: forget the pairing code and withdraw a request made with it."""
    with session.vault.transaction() as conn:
        pairing.forget_requester_codes(conn, vault_id)
    saved = _saved_request(session.vault.conn, server_url, vault_id)
    if saved is None or saved.pake is None:
        return
    try:
        relay.handoff_cancel(vault_id, saved.request_id)
    except RelayError as exc:
        if exc.status not in (403, 404):
            raise
    with session.vault.transaction() as conn:
        _forget_requests(conn, vault_id)


# long: PROTOCOL §14's requester steps in their order; the branches are helpers below
def request_key(
    session: VaultSession,
    label: str | None = None,
    *,
    wait: float = DEFAULT_WAIT_SECS,
    poll: float = POLL_SECS,
    on_waiting: Callable[[Waiting], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    expect: str | None = None,
    confirm: Callable[[str], bool] | None = None,
    use_code: bool = True,
) -> str:
    """Ask an admin for K (or resume the open request) and keep it; returns the vault id.

    `on_waiting` is called once with the fingerprint to show. With the pairing code
    this device was linked with (and `use_code`), the code authenticates the seal.
    Without one, the admin key's fingerprint must match `expect` or be confirmed by
    `confirm(fingerprint)`; with neither, nothing is claimed once the admin sealed
    (run again with `expect`). TeamError, with nothing stored, when no admin sealed
    it within `wait` seconds (the request stays open: run again to resume), when it
    expired, or when the seal is refused (PROTOCOL §14 step 4).
    """
    server_url, _, vault_id = _linked(session)
    if stored_vault_key(session.vault.conn, vault_id) is not None:
        raise TeamError(f"this device already holds the key of vault {vault_id}")
    label = label or session.device.label
    with _client(session) as relay:
        if not use_code:
            _drop_code(session, relay, server_url, vault_id)
        saved = _saved_request(session.vault.conn, server_url, vault_id)
        waiting = _resumable(session, relay, saved, vault_id) if saved is not None else None
        if waiting is None:
            code = pairing.requester_code(session.vault.conn, server_url, vault_id)
            try:
                waiting = _start(session, relay, label, code)
            except ForbiddenError as exc:
                raise TeamError(f"the relay refused the request: {exc.message}") from None
            saved = _saved_request(session.vault.conn, server_url, vault_id)
        assert saved is not None
        if on_waiting is not None:
            on_waiting(waiting)
        _wait_for_seal(relay, vault_id, waiting, wait, poll, sleep)
        if saved.pake is None and expect is None and confirm is None:
            # PROTOCOL §14 step 4: K is kept only after the admin key's fingerprint is
            # confirmed; the seal stays on the relay for a run that can confirm it.
            raise TeamError(
                f"an admin approved request {waiting.request_id}, but this device keeps the "
                "vault key only after you confirm the admin key's fingerprint that `engram-sync "
                "team approve` showed: run `engram-sync team request --expect FINGERPRINT`, or "
                "run it in a terminal to be asked (nothing was claimed or stored)"
            )
        claimed = _claim(session, relay, vault_id, waiting)
        key, admin_fingerprint = _authenticate(session, relay, saved, claimed, vault_id)
        _check_admin(session, saved, vault_id, admin_fingerprint, expect, confirm)
    with session.vault.transaction() as conn:
        store_vault_key(conn, key, "handoff")
        _forget_requests(conn, vault_id)
        if saved.pairing_id is not None:
            pairing.forget_code(conn, saved.pairing_id, "requester")
    session.forget_keys()
    return vault_id


def _resumable(
    session: VaultSession, relay: AccountClient, saved: _Saved, vault_id: str
) -> Waiting | None:
    """The saved request as one to wait on again, if the relay still has it pending or
    sealed; otherwise it is forgotten and None (a new request is made)."""
    try:
        state = relay.handoff_status(vault_id, saved.request_id).status
    except RelayError as exc:
        if exc.status not in (403, 404):
            raise
        state = "gone"
    if state in ("pending", "sealed"):
        return Waiting(
            saved.request_id,
            saved.keypair.fingerprint,
            saved.expires_at,
            resumed=True,
            by_code=saved.pake is not None,
        )
    with session.vault.transaction() as conn:
        _forget_requests(conn, vault_id)
    return None


def _claim(
    session: VaultSession, relay: AccountClient, vault_id: str, waiting: Waiting
) -> HandoffClaimed:
    """The sealed answer; a request already claimed or expired (410) is forgotten."""
    try:
        return relay.handoff_claim(vault_id, waiting.request_id)
    except RelayError as exc:
        if exc.status == 410:
            with session.vault.transaction() as conn:
                _forget_requests(conn, vault_id)
            raise TeamError(
                "this request was already claimed or expired: run `engram-sync team request` again"
            ) from None
        raise


def _check_admin(
    session: VaultSession,
    saved: _Saved,
    vault_id: str,
    admin_fingerprint: str,
    expect: str | None,
    confirm: Callable[[str], bool] | None,
) -> None:
    """PROTOCOL §14 step 4: the admin key's fingerprint is the expected one or confirmed by
    the person (a request authenticated by its pairing code needs neither)."""
    if expect is not None and normalize_fingerprint(expect) != admin_fingerprint:
        _refuse(
            session,
            saved,
            vault_id,
            f"the admin key's fingerprint is {admin_fingerprint}, not the expected "
            f"{normalize_fingerprint(expect)}: a relay may have sealed a key of its own",
        )
    if saved.pake is None and expect is None:
        assert confirm is not None
        if not confirm(admin_fingerprint):
            _refuse(
                session,
                saved,
                vault_id,
                f"the admin key's fingerprint {admin_fingerprint} was not confirmed",
            )


def _refuse(session: VaultSession, saved: _Saved, vault_id: str, why: str) -> NoReturn:
    """Forget the claimed request (and its code: the admin's device used its copy) and
    raise: nothing was stored (PROTOCOL §14 step 4)."""
    with session.vault.transaction() as conn:
        _forget_requests(conn, vault_id)
        if saved.pairing_id is not None:
            pairing.forget_code(conn, saved.pairing_id, "requester")
    again = (
        "run `engram-sync team request` again: without the code, you and the admin compare "
        "fingerprints"
        if saved.pake is not None
        else "run `engram-sync team request` again and compare the fingerprints carefully"
    )
    raise TeamError(f"REFUSED the vault key: {why}. Nothing was stored; {again}")


def _authenticate(
    session: VaultSession,
    relay: AccountClient,
    saved: _Saved,
    claimed: HandoffClaimed,
    vault_id: str,
) -> tuple[VaultKey, str]:
    """Open the claimed seal as PROTOCOL §14 step 4 says; returns K and the admin key's
    fingerprint, or refuses (nothing stored)."""
    try:
        if saved.pake is not None:
            wire = {
                "public_key": claimed.public_key,
                "sealed": claimed.sealed,
                "pake": _given(claimed.pake) or "",
                "auth": _given(claimed.auth) or "",
            }
            key = open_wire_with_code(saved.pake, saved.keypair, saved.request_id, wire, vault_id)
        else:
            key = open_handoff_wire(saved.keypair, claimed.public_key, claimed.sealed, vault_id)
        admin_fingerprint = public_key_fingerprint(decode_public_key(claimed.public_key))
    except HandoffError as exc:
        _refuse(session, saved, vault_id, str(exc))
    # PROTOCOL §14 step 4, defence in depth: a K that opens none of the vault's blobs.
    if keys_open_relay_blobs(relay, vault_id, SyncKeys(key.enc_key, key.hmac_key)) is False:
        _refuse(
            session,
            saved,
            vault_id,
            f"the unsealed key verifies none of the blobs vault {vault_id} holds on the relay, "
            "so it is not the vault's key (a relay that sealed a key of its own?)",
        )
    return key, admin_fingerprint


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
            fingerprint = INVALID_FINGERPRINT
        found.append(
            PendingRequest(
                r.request_id,
                r.label,
                fingerprint,
                r.created_at,
                r.expires_at,
                r.public_key,
                _given(r.pake),
                _given(r.pairing_id),
            )
        )
    return found


def find_pending(session: VaultSession, request_id: str) -> PendingRequest:
    """One open request by id; TeamError naming `team pending` otherwise."""
    for request in pending(session):
        if request.request_id == request_id:
            if request.fingerprint == INVALID_FINGERPRINT:
                raise TeamError(f"request {request_id} carries an invalid public key: refuse it")
            return request
    raise TeamError(
        f"no open request {request_id}: `engram-sync team pending` lists them (a request "
        "lives 15 minutes)"
    )


def has_code_for(session: VaultSession, request: PendingRequest) -> bool:
    """Whether this device holds the pairing code `request` was made with."""
    server_url, _, vault_id = _linked(session)
    if request.pairing_id is None:
        return False
    return (
        pairing.admin_code(session.vault.conn, request.pairing_id, server_url, vault_id) is not None
    )


# long: PROTOCOL §14's admin steps in their order, each a few lines; split, the order would be
#   harder to check
def approve(session: VaultSession, request: PendingRequest) -> Approval:
    """Seal this device's K to `request`.

    With a pairing code (one this device issued) the seal is bound to the code and
    authenticated; the code is then forgotten, so a relay gets one guess at most.
    Without one, call only after the requester's fingerprint was confirmed, and show
    the returned `admin_fingerprint`: the new device confirms it (PROTOCOL §14 step 4).
    """
    server_url, _, vault_id = _linked(session)
    code: PairingCode | None = None
    if request.by_code:
        if request.pairing_id is None:
            raise TeamError(f"request {request.request_id} carries no pairing id: refuse it")
        code = pairing.admin_code(session.vault.conn, request.pairing_id, server_url, vault_id)
        if code is None:
            raise TeamError(
                f"request {request.request_id} was made with a pairing code this device did not "
                "issue, or whose secret part was already used: approve it on the device that ran "
                "`engram-sync team invite`, or have the new device run `engram-sync team request "
                "--no-code` and compare fingerprints"
            )
    keys = session.keys
    with _client(session) as relay:
        verify_keys_on_relay(relay, vault_id, keys)
        k = pack_keys(keys, vault_id)
        requester_public = decode_public_key(request.public_key)
        if code is not None:
            assert request.pake is not None
            assert request.pairing_id is not None
            try:
                requester_message = decode_pake_message(request.pake, SIDE_REQUESTER)
            except HandoffError as exc:
                raise TeamError(
                    f"request {request.request_id} is malformed ({exc}): refuse it"
                ) from None
            # PROTOCOL §14 step 4: one exchange per code, so the relay gets one online
            # guess at most: the code is forgotten before the seal leaves this device.
            with session.vault.transaction() as conn:
                pairing.forget_code(conn, request.pairing_id, "admin")
            try:
                made = seal_vault_key_with_code(
                    pake_password(code), request.request_id, requester_public, requester_message, k
                )
            except HandoffError as exc:
                raise TeamError(
                    f"request {request.request_id} is malformed ({exc}): refuse it"
                ) from None
            wire = made.to_wire()
            admin_public = made.seal.admin_public_key
        else:
            sealed = seal_vault_key(requester_public, k)
            wire = sealed.to_wire()
            admin_public = sealed.admin_public_key
        try:
            relay.handoff_seal(
                vault_id,
                request.request_id,
                wire["public_key"],
                wire["sealed"],
                pake=wire.get("pake"),
                auth=wire.get("auth"),
            )
        except ForbiddenError as exc:
            raise _admin_only(exc) from None
        except RelayError as exc:
            if exc.status in (400, 404, 409, 410):
                raise TeamError(
                    f"cannot approve request {request.request_id}: {exc.message}"
                ) from None
            raise
    return Approval(request.request_id, code is not None, public_key_fingerprint(admin_public))
