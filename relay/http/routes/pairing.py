"""Pairing codes: an admin issues a short code, a new device redeems it for its own key.

`POST /v1/vaults/{v}/pairing-codes` accepts an admin key for v or — the one
vault route that takes a session — the session of an account that owns v or was
granted it (PROTOCOL §13). `POST /pair/redeem` needs no auth: the code is the credential,
so it is single use, lives 10 minutes, and redeeming is rate limited per IP.
Unknown, used and expired codes get the same 410 `code_invalid`.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import asyncpg
from litestar import Request, post
from litestar.params import FromPath

from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.auth import authenticate_session, authorize, bearer_is_session
from engram_sync.relay.http.bodies import BODY_OPT, OPTIONAL_BODY_OPT, decode_body
from engram_sync.relay.http.client_ip import client_ip
from engram_sync.relay.http.errors import RelayError, bad_request, forbidden
from engram_sync.relay.http.routes.account_support import check_label
from engram_sync.relay.http.routes.account_support import limit_per_minute as limit
from engram_sync.relay.http.routes.accounts import REDEEM_PER_MINUTE
from engram_sync.relay.http.routes.ids import require_id
from engram_sync.relay.http.routes.once import Once
from engram_sync.relay.store import accounts as account_store
from engram_sync.relay.store import owners
from engram_sync.relay.store import pairing as store
from engram_sync.relay.store import retire as retirement
from engram_sync.shared_format.pairing import (
    PairingCodeError,
    normalize_pairing_code,
    pairing_code_hash,
)
from engram_sync.shared_format.timestamps import format_rfc3339
from engram_sync.shared_format.wire import (
    CreatePairingCodeRequest,
    PairingCodeIssued,
    PairingRedeemed,
    RedeemPairingCodeRequest,
)

log = logging.getLogger(__name__)


async def _creator(request: Request[Any, Any, Any], vault_id: str) -> str:
    """Who issues the code: an admin key for the vault, or a session of an owning account."""
    if bearer_is_session(request):
        session = await authenticate_session(request)
        pool = relay_state(request).require_pool()
        if not await account_store.owns_vault(pool, session.account_id, vault_id):
            raise forbidden(
                f"this account neither owns vault {vault_id} nor was granted it, so it cannot "
                "pair devices to it",
                code="not_vault_owner",
            )
        return store.ACCOUNT_CREATOR + session.account_id
    principal = await authorize(request, vault_id, admin=True)
    if principal.account_id is None:  # PROTOCOL §13: an operator key's code is operator use
        await owners.claim_operator(relay_state(request).require_pool(), [vault_id])
    return store.KEY_CREATOR + principal.key_id


@post(
    "/v1/vaults/{vault_id:str}/pairing-codes",
    status_code=200,
    tags=["pairing"],
    opt={BODY_OPT: CreatePairingCodeRequest, OPTIONAL_BODY_OPT: True},
)
async def create_pairing_code(
    request: Request[Any, Any, Any], vault_id: FromPath[str]
) -> PairingCodeIssued:
    """Issue `ENG-XXXX-XXXX-XXXX` (10 minutes, single use); 409 `too_many_codes` past 5 live."""
    require_id(vault_id, "vault_id")
    created_by = await _creator(request, vault_id)
    data = await decode_body(request, CreatePairingCodeRequest, empty_ok=True)
    label = check_label(data.label)
    once = await Once.of(request, scope=created_by)  # a repeat: the same code (docs/retries.md)

    async def issue(conn: asyncpg.Connection) -> PairingCodeIssued:
        await retirement.refuse_if_retired(conn, vault_id)  # PROTOCOL §19: 410 vault_retired
        try:
            issued = await store.create_code(
                conn, vault_id, label=label, device_bound=data.device_bound, created_by=created_by
            )
        except store.TooManyCodesError:
            raise RelayError(
                409,
                "too_many_codes",
                f"this vault already has {store.MAX_LIVE_CODES} unused pairing codes; use one "
                "or wait for them to expire (10 minutes)",
            ) from None
        return PairingCodeIssued(
            code=issued.code,
            vault_id=vault_id,
            expires_at=format_rfc3339(issued.expires_at),
            label=label,
            device_bound=data.device_bound,
        )

    return await once.run(PairingCodeIssued, issue)


@post("/pair/redeem", status_code=200, tags=["pairing"], opt={BODY_OPT: RedeemPairingCodeRequest})
async def redeem_pairing_code(request: Request[Any, Any, Any]) -> PairingRedeemed:
    """Trade a code for a non-admin key (bound to `device_id` unless the code says otherwise)."""
    limit(request, f"redeem:{client_ip(request)}", REDEEM_PER_MINUTE)
    data = await decode_body(request, RedeemPairingCodeRequest)
    try:
        code = normalize_pairing_code(data.code)
    except PairingCodeError as exc:
        raise bad_request(f"code: {exc}", code="invalid_request", field="code") from None
    device_id = require_id(data.device_id.strip(), "device_id")
    label = check_label(data.label)
    # A repeat under the same key gets the key the code was traded for (docs/retries.md);
    # the scope is the code itself, which only its holder knows.
    once = await Once.of(request, scope="pairing-code:" + pairing_code_hash(code).hex())

    async def trade(conn: asyncpg.Connection) -> PairingRedeemed | None:
        try:
            redeemed = await store.redeem(conn, code, device_id, label)
        except store.DeviceRevokedError:
            raise forbidden(
                f"device {device_id} was revoked for this vault; pair it under a new device id",
                code="device_revoked",
            ) from None
        if redeemed is None:  # unknown, used or expired: committed (an expired code is erased)
            return None
        log.info("pairing code redeemed", extra={"key_id": redeemed.key_id})
        return PairingRedeemed(
            vault_id=redeemed.vault_id,
            api_key=redeemed.api_key,
            key_id=redeemed.key_id,
            device_id=device_id,
            label=redeemed.label,
            device_bound=redeemed.device_bound,
        )

    traded = await once.run_or_nothing(PairingRedeemed, trade)
    if traded is None:
        raise RelayError(
            410,
            "code_invalid",
            "this pairing code is unknown, already used or expired: ask for a new one",
        )
    return traded


ROUTES: Final = [create_pairing_code, redeem_pairing_code]
