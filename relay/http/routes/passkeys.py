"""Passkey wraps of vault keys (issue 34 slice 4; docs/web-vault.md "Passkey unlock", our
addition to PROTOCOL §13, wire-additive): `PUT/GET/DELETE
/account/vaults/{v}/passkeys/{credential_id}` and `GET /account/vaults/{v}/passkeys`.

The browser wraps K under a key it derives from the passkey's PRF output (HKDF-SHA256); the
relay stores the wrap and the PRF salt as opaque text, with the rules of the other §13 wraps:
a session (`Authorization: Bearer ses_…`), the current login `password` in the body of a
write or delete, 512 decoded bytes per wrap, 16..64 per salt, and only for a vault the account
owns or was granted (403 `vault_owned` otherwise, one answer for taken and foreign ids). At
most MAX_PASSKEYS_PER_VAULT per account and vault (409 `too_many_passkeys`). Wraps, salts and
passwords are never logged.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from litestar import Request, delete, get, put
from litestar.params import FromPath

from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.auth import authenticate_session
from engram_sync.relay.http.bodies import BODY_OPT, decode_body
from engram_sync.relay.http.errors import RelayError, bad_request
from engram_sync.relay.http.routes.account_support import (
    confirm_password,
    no_wrap,
    salt_b64,
    wrap_b64,
)
from engram_sync.relay.http.routes.ids import require_id
from engram_sync.relay.store import owners
from engram_sync.relay.store import passkey_wraps as store
from engram_sync.shared_format.b64 import Base64Error, b64url_decode, b64url_encode
from engram_sync.shared_format.timestamps import format_rfc3339
from engram_sync.shared_format.wire import (
    PasskeyInfo,
    PasskeyList,
    PasskeyWrap,
    PasskeyWrapDeleted,
    PasskeyWrapWrite,
    PasswordConfirmation,
)

log = logging.getLogger(__name__)

#: WebAuthn credential ids are at most 1023 bytes (WebAuthn Level 3, §5.1 "rawId").
MAX_CREDENTIAL_ID_BYTES: Final = 1023
_PATH: Final = "/account/vaults/{vault_id:str}/passkeys"


def credential_problem(credential_id: str) -> str | None:
    """Why `credential_id` is not one WebAuthn credential id in canonical base64url without
    padding (1..1023 bytes), or None. Pure: tested without a server."""
    if len(credential_id) > (MAX_CREDENTIAL_ID_BYTES * 4 + 2) // 3:
        return f"credential_id is longer than {MAX_CREDENTIAL_ID_BYTES} bytes"
    try:
        raw = b64url_decode(credential_id)
    except Base64Error as exc:
        return f"credential_id: {exc}"
    if not raw:
        return "credential_id is empty"
    if b64url_encode(raw) != credential_id:
        return "credential_id is not canonical base64url"
    return None


def checked_credential(credential_id: str) -> str:
    """`credential_id` if canonical; 400 naming the field otherwise."""
    problem = credential_problem(credential_id)
    if problem:
        raise bad_request(problem, code="invalid_request", field="credential_id")
    return credential_id


@put(_PATH + "/{credential_id:str}", tags=["accounts"], opt={BODY_OPT: PasskeyWrapWrite})
async def put_passkey_wrap(
    request: Request[Any, Any, Any], vault_id: FromPath[str], credential_id: FromPath[str]
) -> PasskeyWrap:
    """Store K wrapped under a passkey (current `password` required); never claims a vault."""
    session = await authenticate_session(request)
    require_id(vault_id, "vault_id")
    checked_credential(credential_id)
    data = await decode_body(request, PasskeyWrapWrite)
    wrapped_k = wrap_b64(data.wrapped_k, "wrapped_k")  # PROTOCOL §13: 512 bytes per wrap
    prf_salt = salt_b64(data.prf_salt, "prf_salt")  # PROTOCOL §13: 64 bytes per salt
    await confirm_password(request, session, data.password)
    pool = relay_state(request).require_pool()
    if not await owners.may_use(pool, session.account_id, vault_id):
        raise owners.VaultOwnedError(vault_id)  # §13: one answer for taken and foreign ids
    try:
        updated = await store.put(
            pool, session.account_id, vault_id, credential_id, wrapped_k, prf_salt
        )
    except store.TooManyPasskeysError:
        raise RelayError(
            409,
            "too_many_passkeys",
            f"this account holds {store.MAX_PASSKEYS_PER_VAULT} passkeys for vault {vault_id}:"
            " remove one first",
        ) from None
    log.info("passkey wrap stored", extra={"account_id": session.account_id})
    return PasskeyWrap(vault_id, credential_id, wrapped_k, prf_salt, format_rfc3339(updated))


@get(_PATH + "/{credential_id:str}", tags=["accounts"])
async def get_passkey_wrap(
    request: Request[Any, Any, Any], vault_id: FromPath[str], credential_id: FromPath[str]
) -> PasskeyWrap:
    """One passkey wrap of the account; 404 `no_wrap` if none (removed, or never stored)."""
    session = await authenticate_session(request)
    require_id(vault_id, "vault_id")
    checked_credential(credential_id)
    found = await store.get(
        relay_state(request).require_pool(), session.account_id, vault_id, credential_id
    )
    if found is None:
        raise no_wrap(f"passkey wrap for vault {vault_id} under this credential")
    return PasskeyWrap(
        vault_id, credential_id, found.wrapped_k, found.prf_salt, format_rfc3339(found.updated_at)
    )


@get(_PATH, tags=["accounts"])
async def list_passkeys(request: Request[Any, Any, Any], vault_id: FromPath[str]) -> PasskeyList:
    """The account's passkeys for the vault (credential ids and salts, never the wraps)."""
    session = await authenticate_session(request)
    require_id(vault_id, "vault_id")
    rows = await store.listed(relay_state(request).require_pool(), session.account_id, vault_id)
    return PasskeyList(
        vault_id,
        [PasskeyInfo(r.credential_id, r.prf_salt, format_rfc3339(r.updated_at)) for r in rows],
    )


@delete(
    _PATH + "/{credential_id:str}",
    status_code=200,
    tags=["accounts"],
    opt={BODY_OPT: PasswordConfirmation},
)
async def delete_passkey_wrap(
    request: Request[Any, Any, Any], vault_id: FromPath[str], credential_id: FromPath[str]
) -> PasskeyWrapDeleted:
    """Forget a passkey wrap (current `password` required; idempotent): it unlocks nothing."""
    session = await authenticate_session(request)
    require_id(vault_id, "vault_id")
    checked_credential(credential_id)
    data = await decode_body(request, PasswordConfirmation)
    await confirm_password(request, session, data.password)
    deleted = await store.delete(
        relay_state(request).require_pool(), session.account_id, vault_id, credential_id
    )
    return PasskeyWrapDeleted(vault_id, credential_id, deleted)


ROUTES: Final = [put_passkey_wrap, get_passkey_wrap, list_passkeys, delete_passkey_wrap]
