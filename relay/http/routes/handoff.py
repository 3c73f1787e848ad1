"""Team key handoff, the zero-knowledge mailbox (PROTOCOL §14).

Any key for the vault may post a request (its ephemeral P-256 public key); an
admin key lists pending requests, compares fingerprints with the requester and
seals K to that key; only the requesting key may claim the seal, exactly once.
Fingerprints are always recomputed from the stored public key, never stored,
so what an admin is shown is a function of the very key it would seal to.

A request made with a pairing code carries the requester's SPAKE2 message and
the code's public id; its seal must then carry the admin's SPAKE2 message and
`auth` (PROTOCOL §14 step 4), and a request without them takes a seal without
them. The relay only checks shapes: the authentication is between the clients.
"""

from __future__ import annotations

from typing import Any, Final

import asyncpg
from litestar import Request, delete, get, post
from litestar.params import FromPath
from msgspec import UNSET, UnsetType

from engram_sync.relay.domain.api_keys import Principal
from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.auth import authorize
from engram_sync.relay.http.bodies import BODY_OPT, decode_body
from engram_sync.relay.http.errors import RelayError, bad_request, forbidden
from engram_sync.relay.http.routes.account_support import check_label
from engram_sync.relay.http.routes.ids import require_id
from engram_sync.relay.http.routes.once import Once
from engram_sync.relay.store import handoff as store
from engram_sync.relay.store import retire as retirement
from engram_sync.relay.store.handoff import HandoffRow
from engram_sync.shared_format.errors import HandoffError
from engram_sync.shared_format.handoff import (
    decode_public_key,
    decode_sealed,
    public_key_fingerprint,
)
from engram_sync.shared_format.handoff_pake import (
    SIDE_ADMIN,
    SIDE_REQUESTER,
    decode_auth,
    decode_pake_message,
)
from engram_sync.shared_format.pairing import is_pairing_id
from engram_sync.shared_format.timestamps import format_rfc3339
from engram_sync.shared_format.wire import (
    HandoffCancelled,
    HandoffClaimed,
    HandoffCreated,
    HandoffCreateRequest,
    HandoffList,
    HandoffPending,
    HandoffSealed,
    HandoffSealRequest,
    HandoffStatus,
)

INVALID_FINGERPRINT: Final = "INVALID-PUBLIC-KEY"


def _fingerprint(public_key: str) -> str:
    """Recomputed on every read from the stored key (a stored copy could be forged apart)."""
    try:
        return public_key_fingerprint(decode_public_key(public_key))
    except HandoffError:
        return INVALID_FINGERPRINT


def _public_key(value: str, field: str = "public_key") -> str:
    try:
        decode_public_key(value)
    except HandoffError as exc:
        raise bad_request(str(exc), code="invalid_request", field=field) from None
    return value


def _optional(value: str | None) -> str | UnsetType:
    return UNSET if value is None else value


def _both_or_neither(
    first: str | UnsetType, second: str | UnsetType, names: tuple[str, str]
) -> tuple[str, str] | None:
    """PROTOCOL §14 step 4: the two pairing-code fields come together or not at all."""
    if first is UNSET and second is UNSET:
        return None
    if first is UNSET or second is UNSET:
        missing = names[0] if first is UNSET else names[1]
        raise bad_request(
            f"`{names[0]}` and `{names[1]}` go together", code="invalid_request", field=missing
        )
    return first, second


def _pake(value: str, side: bytes) -> str:
    try:
        decode_pake_message(value, side)
    except HandoffError as exc:
        raise bad_request(str(exc), code="invalid_request", field="pake") from None
    return value


def _not_found() -> RelayError:
    return RelayError(404, "handoff_not_found", "no such handoff request in this vault")


def _refusal(row: HandoffRow | None, action: str) -> RelayError:
    """Why `action` did not happen to `row` (404, 410 or 409)."""
    if row is None:
        return _not_found()
    if row.status == "claimed":
        return RelayError(410, "already_claimed", "this handoff was already claimed")
    if row.status == "expired":
        return RelayError(410, "expired", "this handoff request expired: make a new one")
    if row.status == "sealed":
        return RelayError(409, "already_sealed", "this handoff request is already sealed")
    return RelayError(409, "not_sealed_yet", f"cannot {action}: no admin has sealed it yet")


def _may_see(principal: Principal, row: HandoffRow, vault_id: str) -> bool:
    return principal.key_id == row.requester_key_id or principal.is_admin_for(vault_id)


@post(
    "/v1/vaults/{vault_id:str}/handoff",
    status_code=200,
    tags=["handoff"],
    opt={BODY_OPT: HandoffCreateRequest},
)
async def create_handoff(
    request: Request[Any, Any, Any], vault_id: FromPath[str]
) -> HandoffCreated:
    """Post an ephemeral P-256 public key (any key for the vault); expires in 15 minutes."""
    principal = await authorize(request, require_id(vault_id, "vault_id"))
    data = await decode_body(request, HandoffCreateRequest)
    public_key = _public_key(data.public_key)
    label = check_label(data.label) or ""
    paired = _both_or_neither(data.pake, data.pairing_id, ("pake", "pairing_id"))
    pake = pairing_id = None
    if paired is not None:
        pake = _pake(paired[0], SIDE_REQUESTER)
        if not is_pairing_id(paired[1]):
            raise bad_request(
                "pairing_id must be 64 lowercase hex characters",
                code="invalid_request",
                field="pairing_id",
            )
        pairing_id = paired[1]
    once = await Once.of(request, scope="key:" + principal.key_id)  # docs/retries.md

    async def open_request(conn: asyncpg.Connection) -> HandoffCreated:
        # A limit reached raises TooManyRequestsError; relay/http/errors.py answers it (409).
        await retirement.refuse_if_retired(conn, vault_id)  # PROTOCOL §19: 410 vault_retired
        row = await store.create(
            conn, vault_id, public_key, label, principal.key_id, pake=pake, pairing_id=pairing_id
        )
        return HandoffCreated(
            request_id=row.request_id,
            vault_id=vault_id,
            expires_at=format_rfc3339(row.expires_at),
            fingerprint=_fingerprint(row.public_key),
        )

    return await once.run(HandoffCreated, open_request)


@get("/v1/vaults/{vault_id:str}/handoff", tags=["handoff"])
async def list_handoffs(request: Request[Any, Any, Any], vault_id: FromPath[str]) -> HandoffList:
    """Pending requests (admin): compare each fingerprint with the requester's screen."""
    await authorize(request, require_id(vault_id, "vault_id"), admin=True)
    rows = await store.pending(relay_state(request).require_pool(), vault_id)
    return HandoffList(
        vault_id=vault_id,
        requests=[
            HandoffPending(
                request_id=r.request_id,
                public_key=r.public_key,
                label=r.label,
                fingerprint=_fingerprint(r.public_key),
                created_at=format_rfc3339(r.created_at),
                expires_at=format_rfc3339(r.expires_at),
                pake=_optional(r.pake),
                pairing_id=_optional(r.pairing_id),
            )
            for r in rows
        ],
    )


@get("/v1/vaults/{vault_id:str}/handoff/{request_id:str}", tags=["handoff"])
async def handoff_status(
    request: Request[Any, Any, Any], vault_id: FromPath[str], request_id: FromPath[str]
) -> HandoffStatus:
    """Status of one request (the requesting key, or an admin): pending/sealed/claimed/expired."""
    principal = await authorize(request, require_id(vault_id, "vault_id"))
    row = await store.get(relay_state(request).require_pool(), vault_id, request_id)
    if row is None:
        raise _not_found()
    if not _may_see(principal, row, vault_id):
        raise forbidden("only the key that made this request, or an admin, may see it")
    return HandoffStatus(
        request_id=row.request_id,
        vault_id=vault_id,
        status=row.status,
        fingerprint=_fingerprint(row.public_key),
        label=row.label,
        created_at=format_rfc3339(row.created_at),
        expires_at=format_rfc3339(row.expires_at),
        sealed_at=format_rfc3339(row.sealed_at) if row.sealed_at else None,
        claimed_at=format_rfc3339(row.claimed_at) if row.claimed_at else None,
    )


@post(
    "/v1/vaults/{vault_id:str}/handoff/{request_id:str}/seal",
    status_code=200,
    tags=["handoff"],
    opt={BODY_OPT: HandoffSealRequest},
)
async def seal_handoff(
    request: Request[Any, Any, Any], vault_id: FromPath[str], request_id: FromPath[str]
) -> HandoffSealed:
    """Store the admin's ephemeral public key and the seal of K (admin; once per request)."""
    await authorize(request, require_id(vault_id, "vault_id"), admin=True)
    data = await decode_body(request, HandoffSealRequest)
    admin_public_key = _public_key(data.public_key)
    try:
        decode_sealed(data.sealed)
    except HandoffError as exc:
        raise bad_request(str(exc), code="invalid_request", field="sealed") from None
    authenticated = _both_or_neither(data.pake, data.auth, ("pake", "auth"))
    admin_pake = auth = None
    if authenticated is not None:
        admin_pake = _pake(authenticated[0], SIDE_ADMIN)
        try:
            decode_auth(authenticated[1])
        except HandoffError as exc:
            raise bad_request(str(exc), code="invalid_request", field="auth") from None
        auth = authenticated[1]
    pool = relay_state(request).require_pool()
    sealed_at = await store.seal(
        pool, vault_id, request_id, admin_public_key, data.sealed, admin_pake=admin_pake, auth=auth
    )
    if sealed_at is None:
        row = await store.get(pool, vault_id, request_id)
        if row is not None and row.status == "pending":
            # PROTOCOL §14 step 4: only the pairing-code fields can have stopped it.
            if row.pake is None:
                raise bad_request(
                    "this request was made without a pairing code: seal it without `pake` "
                    "and `auth`",
                    code="invalid_request",
                    field="pake",
                )
            raise bad_request(
                "this request was made with a pairing code: its seal needs `pake` and `auth`",
                code="invalid_request",
                field="pake",
            )
        raise _refusal(row, "seal")
    return HandoffSealed(
        request_id=request_id, vault_id=vault_id, sealed_at=format_rfc3339(sealed_at)
    )


@post("/v1/vaults/{vault_id:str}/handoff/{request_id:str}/claim", status_code=200, tags=["handoff"])
async def claim_handoff(
    request: Request[Any, Any, Any], vault_id: FromPath[str], request_id: FromPath[str]
) -> HandoffClaimed:
    """The seal, exactly once, to the key that made the request; the relay erases it."""
    principal = await authorize(request, require_id(vault_id, "vault_id"))
    pool = relay_state(request).require_pool()
    claimed = await store.claim(pool, vault_id, request_id, principal.key_id)
    if claimed is None:
        row = await store.get(pool, vault_id, request_id)
        if row is not None and row.requester_key_id != principal.key_id:
            raise forbidden("only the key that made this request can claim it")
        raise _refusal(row, "claim")
    return HandoffClaimed(
        request_id=request_id,
        vault_id=vault_id,
        public_key=claimed.admin_public_key,
        sealed=claimed.sealed,
        pake=_optional(claimed.admin_pake),
        auth=_optional(claimed.auth),
    )


@delete("/v1/vaults/{vault_id:str}/handoff/{request_id:str}", status_code=200, tags=["handoff"])
async def cancel_handoff(
    request: Request[Any, Any, Any], vault_id: FromPath[str], request_id: FromPath[str]
) -> HandoffCancelled:
    """Withdraw a request and anything sealed to it (the requesting key, or an admin)."""
    principal = await authorize(request, require_id(vault_id, "vault_id"))
    pool = relay_state(request).require_pool()
    row = await store.get(pool, vault_id, request_id)
    if row is None:
        raise _not_found()
    if not _may_see(principal, row, vault_id):
        raise forbidden("only the key that made this request, or an admin, may withdraw it")
    await store.cancel(pool, vault_id, request_id)
    return HandoffCancelled(request_id=request_id, vault_id=vault_id)


ROUTES: Final = [
    create_handoff,
    list_handoffs,
    handoff_status,
    seal_handoff,
    claim_handoff,
    cancel_handoff,
]
