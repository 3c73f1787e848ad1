"""Retiring a vault after a re-key (PROTOCOL §19, docs/rekey.md "Relay").

`POST /v1/vaults/{old}/retire {"successor": "<vault id>" | null}` needs the owner of
`old` (PROTOCOL §13: an operator admin key, or an admin key the account that owns `old`
minted; an admin grant gets 403 `owner_only`; the undo: relay.http.routes.retire_undo).
A successor must be another valid vault id that the same key may use too
(a key scoped to it, or an account that owns it or was granted it), so a retire cannot
point devices at a vault its caller cannot use. The retire is idempotent: the same call
again answers the same 200; another successor answers 409 `already_retired`.

The body may carry the successor statement (PROTOCOL §19, last bullet): `statement`, base64
of a 32-byte HMAC, and `stated_at`, the text it covers (at most 64 bytes). The relay cannot
check it (it never holds the old vault's key): it checks the shape, stores it, and hands it
back in every `retired` answer; the followers check it (docs/rekey.md "The successor
statement").
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Final

from litestar import Request, post
from litestar.params import FromPath
from msgspec import UNSET

from engram_sync.relay.domain.api_keys import Principal
from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.auth import authorize, authorize_owner
from engram_sync.relay.http.bodies import BODY_OPT, decode_body
from engram_sync.relay.http.errors import bad_request, forbidden
from engram_sync.relay.http.routes.ids import require_id
from engram_sync.relay.store import owners
from engram_sync.relay.store import retire as store
from engram_sync.shared_format.b64 import Base64Error, b64decode_std
from engram_sync.shared_format.successor_statement import MAC_BYTES, MAX_STATED_AT_BYTES
from engram_sync.shared_format.timestamps import format_rfc3339
from engram_sync.shared_format.wire import RetireRequest, RetireResponse

log = logging.getLogger(__name__)


async def authorize_until_erased(
    request: Request[Any, Any, Any], vault_id: str, *, admin: bool = False
) -> Principal:
    """`authorize`, then 410 `vault_retired` once the vault's grace period is over
    (PROTOCOL §19: every route of an erased vault answers it; checked after the key, so
    the relay tells nobody else that a vault exists)."""
    principal = await authorize(request, vault_id, admin=admin)
    await store.refuse_if_erased(relay_state(request).require_pool(), vault_id)
    return principal


async def _may_use_successor(
    request: Request[Any, Any, Any], principal: Principal, vault: str
) -> bool:
    if principal.can_access(vault):
        return True
    if principal.account_id is None:
        return False
    pool = relay_state(request).require_pool()
    return await owners.may_use(pool, principal.account_id, vault)


def _given(value: object) -> object:
    return None if value is UNSET else value


def stated_successor(data: RetireRequest) -> store.Statement | None:
    """PROTOCOL §19: the successor statement of a retire body, its shape checked (400
    naming the field): both fields or neither, a successor to state, `statement` strict
    base64 of exactly 32 bytes, `stated_at` 1..64 bytes of text without control
    characters (the MAC separates its fields with 0x00)."""
    statement, stated_at = _given(data.statement), _given(data.stated_at)
    if statement is None and stated_at is None:
        return None
    for name, value in (("statement", statement), ("stated_at", stated_at)):
        if value is None:
            raise bad_request(
                f"{name}: a successor statement needs both `statement` and `stated_at`",
                code="invalid_request",
                field=name,
            )
    assert isinstance(statement, str)  # msgspec's types
    assert isinstance(stated_at, str)
    if data.successor is None:
        raise bad_request(
            "statement: a retire that names no successor has nothing to state",
            code="invalid_request",
            field="statement",
        )
    try:
        mac = b64decode_std(statement)
    except Base64Error:
        mac = b""
    if len(mac) != MAC_BYTES:
        raise bad_request(
            f"statement: must be standard base64 of a {MAC_BYTES}-byte HMAC-SHA256",
            code="invalid_request",
            field="statement",
        )
    raw = stated_at.encode("utf-8", "surrogatepass")
    if not raw or len(raw) > MAX_STATED_AT_BYTES or any(c < 0x20 or c == 0x7F for c in raw):
        raise bad_request(
            f"stated_at: must be 1..{MAX_STATED_AT_BYTES} bytes of text without control "
            "characters (the retired_at the statement covers)",
            code="invalid_request",
            field="stated_at",
        )
    return store.Statement(statement, stated_at)


@post(
    "/v1/vaults/{vault_id:str}/retire",
    status_code=200,
    tags=["retire"],
    opt={BODY_OPT: RetireRequest},
)
async def retire_vault(request: Request[Any, Any, Any], vault_id: FromPath[str]) -> RetireResponse:
    """Retire the vault: from the commit on, every push to it is refused 410 `vault_retired`;
    pulls carry `retired` until `erase_after`, then its blobs are erased (admin; idempotent).
    """
    state = relay_state(request)
    # PROTOCOL §13: only the owner retires (403 `owner_only` for an admin grant)
    principal = await authorize_owner(request, require_id(vault_id, "vault_id"), "retire it")
    data = await decode_body(request, RetireRequest)
    successor = data.successor
    if successor is not None:
        require_id(successor, "successor")
        if successor == vault_id:
            raise bad_request(
                "successor: a vault cannot be its own successor",
                code="invalid_request",
                field="successor",
            )
        if not await _may_use_successor(request, principal, successor):
            raise forbidden(
                f"this key may not use vault {successor}, so it cannot name it as the "
                "successor: use a key (or account) that reaches both vaults",
                code="successor_forbidden",
            )
    stated = stated_successor(data)
    grace = timedelta(days=state.config.retire_grace_days)
    done = await store.retire(state.require_pool(), vault_id, successor, grace, stated)
    log.info(
        "vault retired",
        extra={"vault_id": vault_id, "successor": done.successor, "key_id": principal.key_id},
    )
    return RetireResponse(
        vault_id=done.vault_id,
        successor=done.successor,
        retired_at=format_rfc3339(done.retired_at),
        erase_after=format_rfc3339(done.erase_after),
        statement=UNSET if done.statement is None else done.statement,
        stated_at=UNSET if done.stated_at is None else done.stated_at,
    )


ROUTES: Final = [retire_vault]
