"""Vault grants: an admin of a vault lets an account in (PROTOCOL §13 "Vault ownership",
"Grants carry a role").

A granted account may mint keys for the vault (`POST /account/keys`) and store its
wrap there (`PUT /account/vaults/{v}/wrap`). A `member` grant (the default) mints member
keys only; an `admin` grant may also mint admin keys, grant `member` and revoke devices.
Every route here needs an admin key for the vault (the owner's, or an admin grant's);
granting `admin`, taking it back and removing an admin grant are the owner's
(relay.domain.grant_roles). Removing a grant revokes every key the account minted for the vault,
at once. docs/vault-ownership.md.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from litestar import Request, delete, get, post
from litestar.params import FromPath

from engram_sync.relay.domain import grant_roles
from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.auth import authorize, standing
from engram_sync.relay.http.bodies import BODY_OPT, decode_body
from engram_sync.relay.http.errors import RelayError, bad_request
from engram_sync.relay.http.routes.ids import require_id
from engram_sync.relay.store import owners
from engram_sync.shared_format.timestamps import format_rfc3339
from engram_sync.shared_format.wire import (
    GrantRequest,
    VaultGrantInfo,
    VaultGrantList,
    VaultGrantRevoked,
)

log = logging.getLogger(__name__)


@post(
    "/v1/vaults/{vault_id:str}/grants",
    status_code=200,
    tags=["grants"],
    opt={BODY_OPT: GrantRequest},
)
async def create_grant(request: Request[Any, Any, Any], vault_id: FromPath[str]) -> VaultGrantInfo:
    """Grant the account with `email` (or `account_id`) this vault with `role` (admin;
    idempotent: a repeat sets the role asked).

    404 `no_account` when no account has that email or id; 403 `owner_only` when an admin
    grant asks for `admin` or for taking it back (PROTOCOL §13).
    """
    principal = await authorize(request, require_id(vault_id, "vault_id"), admin=True)
    caller = await standing(request, principal, vault_id)
    data = await decode_body(request, GrantRequest)
    if (data.email is None) == (data.account_id is None):
        raise bad_request(
            "give the account as exactly one of `email` or `account_id`", code="invalid_request"
        )
    who = data.email if data.email is not None else data.account_id
    assert who is not None
    async with relay_state(request).require_pool().acquire() as conn, conn.transaction():
        found = await owners.account_by_email_or_id(conn, who)
        if found is None:
            raise RelayError(404, "no_account", "no account has this email or id on this relay")
        current = await owners.grant_role(conn, vault_id, found[0], lock=True)
        grant_roles.check_grant_change(caller, vault_id, data.role, current)
        if principal.account_id is None:  # an operator key's grant is operator use
            await owners.claim_operator(conn, [vault_id])
        granted_at, role = await owners.grant(
            conn, vault_id, found[0], "key:" + principal.key_id, data.role
        )
    log.info("vault granted", extra={"vault_id": vault_id, "account_id": found[0], "role": role})
    return VaultGrantInfo(vault_id, found[0], found[1], format_rfc3339(granted_at), role)


@get("/v1/vaults/{vault_id:str}/grants", tags=["grants"])
async def list_grants(request: Request[Any, Any, Any], vault_id: FromPath[str]) -> VaultGrantList:
    """The accounts granted this vault, oldest first (admin)."""
    await authorize(request, require_id(vault_id, "vault_id"), admin=True)
    rows = await owners.grants(relay_state(request).require_pool(), vault_id)
    return VaultGrantList(
        vault_id,
        [VaultGrantInfo(g.vault_id, g.account_id, g.email, format_rfc3339(g.granted_at), g.role)
         for g in rows],
    )  # fmt: skip


@delete("/v1/vaults/{vault_id:str}/grants/{account_id:str}", status_code=200, tags=["grants"])
async def revoke_grant(
    request: Request[Any, Any, Any], vault_id: FromPath[str], account_id: FromPath[str]
) -> VaultGrantRevoked:
    """Remove a grant and revoke every key the account minted for the vault (admin;
    idempotent: `revoked` false when there was none). An admin grant is the owner's to
    remove (403 `owner_only`)."""
    principal = await authorize(request, require_id(vault_id, "vault_id"), admin=True)
    caller = await standing(request, principal, vault_id)
    async with relay_state(request).require_pool().acquire() as conn:
        removed = await owners.revoke_grant(
            conn,
            vault_id,
            account_id,
            check=lambda role: grant_roles.check_grant_removal(caller, vault_id, role),
        )
    if removed:
        log.info("vault grant removed", extra={"vault_id": vault_id, "account_id": account_id})
    return VaultGrantRevoked(vault_id, account_id, removed)


ROUTES: Final = [create_grant, list_grants, revoke_grant]
