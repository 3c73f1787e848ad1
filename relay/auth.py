"""Authentication and authorisation of a request (PROTOCOL §5, §10).

401: no key, unknown key, revoked key. 403: key not valid for this vault, not
an admin where admin is needed, or bound to a revoked device (`device_revoked`,
on every route, push and pull alike). 429 after the key's token bucket is empty.
"""

from __future__ import annotations

from typing import Any

from litestar import Request

from relay.errors import RelayError, forbidden, unauthorized
from relay.keys import Principal, hash_key
from relay.state import RelayState, relay_state
from relay.store import keys as key_store


def _bearer(request: Request[Any, Any, Any]) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise unauthorized("missing API key")
    return token


async def authenticate(request: Request[Any, Any, Any]) -> Principal:
    """The principal of the request's key, rate limited; 401/403/429 otherwise."""
    state = relay_state(request)
    token = _bearer(request)
    principal = state.static_keys.get(hash_key(token))
    if principal is None:
        found = await key_store.lookup(state.require_pool(), token)
        if found is None:
            raise unauthorized("unknown or revoked API key")
        # Before the key's own revocation: revoking a device also revokes its keys (§10),
        # and such a key must still get 403 `device_revoked`, not a generic 401.
        if found.device_revoked:
            raise forbidden(
                f"device {found.principal.device_id} was revoked for this vault; this key no "
                "longer works. Ask an admin for a new device key.",
                code="device_revoked",
            )
        if found.revoked:
            raise unauthorized("unknown or revoked API key")
        principal = found.principal
    _rate_limit(state, principal)
    request.state.key_prefix = principal.prefix
    return principal


def _rate_limit(state: RelayState, principal: Principal) -> None:
    wait = state.limiter.take(principal.key_id, principal.rate)
    if wait > 0:
        raise RelayError(
            429,
            "rate_limited",
            f"rate limit of {principal.rate} requests/second exceeded; retry later",
            headers={"Retry-After": state.limiter.retry_after_header(wait)},
        )


async def authorize(
    request: Request[Any, Any, Any], vault_id: str, *, admin: bool = False
) -> Principal:
    """Authenticate, then check the key reaches `vault_id` (and is admin there if asked)."""
    principal = await authenticate(request)
    if not principal.can_access(vault_id):
        raise forbidden("this API key is not valid for this vault")
    if admin and not principal.is_admin_for(vault_id):
        raise forbidden("this route needs an admin key for this vault")
    return principal
