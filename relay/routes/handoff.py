"""Team key handoff, the zero-knowledge mailbox (PROTOCOL §14).

Any key for the vault may post a request (its ephemeral P-256 public key); an
admin key lists pending requests, compares fingerprints with the requester and
seals K to that key; only the requesting key may claim the seal, exactly once.
Fingerprints are always recomputed from the stored public key, never stored,
so what an admin is shown is a function of the very key it would seal to.
"""

from __future__ import annotations

from typing import Any, Final

from litestar import Request, delete, get, post
from litestar.params import FromPath

from relay.auth import authorize
from relay.bodies import BODY_OPT, decode_body
from relay.errors import RelayError, bad_request, forbidden
from relay.ids import require_id
from relay.keys import Principal
from relay.routes.accounts import check_label
from relay.state import relay_state
from relay.store import handoff as store
from relay.store.handoff import HandoffRow
from shared_format.errors import HandoffError
from shared_format.handoff import decode_public_key, decode_sealed, public_key_fingerprint
from shared_format.timestamps import format_rfc3339
from shared_format.wire import (
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
    try:
        row = await store.create(
            relay_state(request).require_pool(), vault_id, public_key, label, principal.key_id
        )
    except store.TooManyRequestsError:
        raise RelayError(
            409,
            "too_many_handoffs",
            f"this vault already has {store.MAX_PENDING_PER_VAULT} open handoff requests; "
            "wait for them to be claimed or to expire",
        ) from None
    return HandoffCreated(
        request_id=row.request_id,
        vault_id=vault_id,
        expires_at=format_rfc3339(row.expires_at),
        fingerprint=_fingerprint(row.public_key),
    )


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
    pool = relay_state(request).require_pool()
    sealed_at = await store.seal(pool, vault_id, request_id, admin_public_key, data.sealed)
    if sealed_at is None:
        raise _refusal(await store.get(pool, vault_id, request_id), "seal")
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
