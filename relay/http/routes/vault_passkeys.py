"""Passkey wraps of passphrase vaults (issue 34; docs/web-vault.md "Passkey unlock", our
addition to PROTOCOL §13, wire-additive): `PUT/GET/DELETE
/v1/vaults/{v}/passkeys/{credential_id}` and `GET /v1/vaults/{v}/passkeys`.

The counterpart of relay/http/routes/passkeys.py for a vault with no account: the browser
wraps K (§13 layout) under a key it derives from the passkey's PRF output and stores the wrap
under the vault's API-key auth (PROTOCOL §10: a key of that vault, a device-bound one too;
403 for a key of another vault; 410 once the vault is erased, §19). The rules of the other
§13 wraps otherwise: 512 decoded bytes per wrap, 16..64 per salt, credential ids canonical
base64url of 1..1023 bytes, at most MAX_PASSKEYS_PER_VAULT per vault (409
`too_many_passkeys`). Wraps and salts are never logged.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from litestar import Request, delete, get, put
from litestar.params import FromPath

from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.bodies import BODY_OPT, decode_body
from engram_sync.relay.http.errors import RelayError
from engram_sync.relay.http.routes.account_support import salt_b64, wrap_b64
from engram_sync.relay.http.routes.ids import require_id
from engram_sync.relay.http.routes.passkeys import checked_credential
from engram_sync.relay.http.routes.retire import authorize_until_erased
from engram_sync.relay.store import vault_passkey_wraps as store
from engram_sync.shared_format.timestamps import format_rfc3339
from engram_sync.shared_format.wire import (
    PasskeyInfo,
    PasskeyList,
    PasskeyWrap,
    PasskeyWrapDeleted,
    VaultPasskeyWrapWrite,
)

log = logging.getLogger(__name__)

_PATH: Final = "/v1/vaults/{vault_id:str}/passkeys"


async def _authorized(request: Request[Any, Any, Any], vault_id: str) -> None:
    await authorize_until_erased(request, require_id(vault_id, "vault_id"))  # §10, §19


def _no_wrap(vault_id: str) -> RelayError:
    return RelayError(
        404, "no_wrap", f"vault {vault_id} has no passkey wrap stored under this credential"
    )


@put(_PATH + "/{credential_id:str}", tags=["passkeys"], opt={BODY_OPT: VaultPasskeyWrapWrite})
async def put_vault_passkey_wrap(
    request: Request[Any, Any, Any], vault_id: FromPath[str], credential_id: FromPath[str]
) -> PasskeyWrap:
    """Store K wrapped under a passkey for this vault (a key of the vault)."""
    await _authorized(request, vault_id)
    checked_credential(credential_id)
    data = await decode_body(request, VaultPasskeyWrapWrite)
    wrapped_k = wrap_b64(data.wrapped_k, "wrapped_k")  # PROTOCOL §13: 512 bytes per wrap
    prf_salt = salt_b64(data.prf_salt, "prf_salt")  # PROTOCOL §13: 64 bytes per salt
    pool = relay_state(request).require_pool()
    try:
        updated = await store.put(pool, vault_id, credential_id, wrapped_k, prf_salt)
    except store.TooManyPasskeysError:
        raise RelayError(
            409,
            "too_many_passkeys",
            f"vault {vault_id} holds {store.MAX_PASSKEYS_PER_VAULT} passkeys: remove one first",
        ) from None
    log.info("vault passkey wrap stored", extra={"vault_id": vault_id})
    return PasskeyWrap(vault_id, credential_id, wrapped_k, prf_salt, format_rfc3339(updated))


@get(_PATH + "/{credential_id:str}", tags=["passkeys"])
async def get_vault_passkey_wrap(
    request: Request[Any, Any, Any], vault_id: FromPath[str], credential_id: FromPath[str]
) -> PasskeyWrap:
    """One passkey wrap of the vault; 404 `no_wrap` if none (removed, or never stored)."""
    await _authorized(request, vault_id)
    checked_credential(credential_id)
    found = await store.get(relay_state(request).require_pool(), vault_id, credential_id)
    if found is None:
        raise _no_wrap(vault_id)
    return PasskeyWrap(
        vault_id, credential_id, found.wrapped_k, found.prf_salt, format_rfc3339(found.updated_at)
    )


@get(_PATH, tags=["passkeys"])
async def list_vault_passkeys(
    request: Request[Any, Any, Any], vault_id: FromPath[str]
) -> PasskeyList:
    """The vault's passkeys (credential ids and salts, never the wraps)."""
    await _authorized(request, vault_id)
    rows = await store.listed(relay_state(request).require_pool(), vault_id)
    return PasskeyList(
        vault_id,
        [PasskeyInfo(r.credential_id, r.prf_salt, format_rfc3339(r.updated_at)) for r in rows],
    )


@delete(_PATH + "/{credential_id:str}", status_code=200, tags=["passkeys"])
async def delete_vault_passkey_wrap(
    request: Request[Any, Any, Any], vault_id: FromPath[str], credential_id: FromPath[str]
) -> PasskeyWrapDeleted:
    """Forget a passkey wrap of the vault (idempotent): it unlocks nothing afterwards."""
    await _authorized(request, vault_id)
    checked_credential(credential_id)
    deleted = await store.delete(relay_state(request).require_pool(), vault_id, credential_id)
    return PasskeyWrapDeleted(vault_id, credential_id, deleted)


ROUTES: Final = [
    put_vault_passkey_wrap,
    get_vault_passkey_wrap,
    list_vault_passkeys,
    delete_vault_passkey_wrap,
]
