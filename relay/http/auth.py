"""Authentication and authorisation of a request (PROTOCOL §5, §10).

401: no key, unknown key, revoked key. 403: key not valid for this vault, not
an admin where admin is needed, or bound to a revoked device (`device_revoked`,
on every route, push and pull alike). 429 after the key's token bucket is empty.
"""

from __future__ import annotations

from typing import Any

from litestar import Request

from engram_sync.relay.domain import grant_roles
from engram_sync.relay.domain.api_keys import DEFAULT_KEY_RATE, Principal, hash_key, key_prefix
from engram_sync.relay.domain.grant_roles import Standing
from engram_sync.relay.domain.ratelimit import RateLimiter
from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.client_ip import client_ip
from engram_sync.relay.http.errors import RelayError, forbidden, unauthorized
from engram_sync.relay.services.state import RelayState
from engram_sync.relay.store import accounts as account_store
from engram_sync.relay.store import minted_keys as key_store
from engram_sync.relay.store import owners
from engram_sync.relay.store.accounts import SESSION_PREFIX, AccountSession


def _bearer(request: Request[Any, Any, Any]) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise unauthorized("missing API key")
    return token


async def authenticate(request: Request[Any, Any, Any]) -> Principal:
    """The principal of the request's key, rate limited; 401/403/429 otherwise. A minted
    key is looked up in the database unless the key gate refuses it first (issue 36:
    relay.domain.key_gate, by the key's recent refusals and by client address)."""
    state = relay_state(request)
    token = _bearer(request)
    digest = hash_key(token)
    principal = state.static_keys.get(digest)
    if principal is None:
        principal = await _minted(request, state, token, digest)
    _rate_limit(state, principal, digest)
    request.state.key_prefix = principal.prefix
    return principal


async def _minted(
    request: Request[Any, Any, Any], state: RelayState, token: str, digest: bytes
) -> Principal:
    """A minted key's principal: the gate's refusal, or the lookup's answer."""
    address = client_ip(request)
    refusal = state.key_gate.before_lookup(digest, address, state.limiter.now())
    if refusal is not None:
        state.metrics.key_gate_refusals.labels(refusal.kind).inc()
        if refusal.kind == "unknown":
            raise unauthorized("unknown or revoked API key")
        raise _too_many(refusal.wait, "too many requests with this key or from this address")
    state.metrics.key_lookups.inc()
    found = await key_store.lookup(state.require_pool(), token)
    if found is None or (found.revoked and not found.device_revoked):
        state.key_gate.not_found(digest, address)  # 401 again without a lookup, a while
        raise unauthorized("unknown or revoked API key")
    # Before the key's own revocation: revoking a device also revokes its keys (§10),
    # and such a key must still get 403 `device_revoked`, not a generic 401.
    if found.device_revoked:
        raise forbidden(
            f"device {found.principal.device_id} was revoked for this vault; this key no "
            "longer works. Ask an admin for a new device key.",
            code="device_revoked",
        )
    state.key_gate.found(digest)
    return found.principal


def _too_many(wait: float, message: str) -> RelayError:
    return RelayError(
        429,
        "rate_limited",
        f"{message}; retry later",
        headers={"Retry-After": RateLimiter.retry_after_header(wait)},
    )


def _rate_limit(state: RelayState, principal: Principal, digest: bytes) -> None:
    wait = state.limiter.take(principal.key_id, principal.rate)
    if wait > 0:
        # its next requests: 429 before a lookup, until its bucket holds a token
        state.key_gate.rate_limited(digest, state.limiter.now() + wait)
        raise _too_many(wait, f"rate limit of {principal.rate} requests/second exceeded")


async def authorize(
    request: Request[Any, Any, Any], vault_id: str, *, admin: bool = False
) -> Principal:
    """Authenticate, then check the key reaches `vault_id` (and is admin there if asked).

    PROTOCOL §13 "Grants carry a role": an admin key an account minted is admin only while
    the account owns the vault or holds an admin grant of it (read on each admin request,
    so a grant turned back into a member grant, or removed, takes effect at once; and the
    admin keys minted under grants before revision 0016 made them `member` lose it)."""
    principal = await authenticate(request)
    if not principal.can_access(vault_id):
        raise forbidden("this API key is not valid for this vault")
    if admin and not principal.is_admin_for(vault_id):
        raise forbidden("this route needs an admin key for this vault")
    if admin:
        grant_roles.require_admin(await standing(request, principal, vault_id), vault_id)
    return principal


async def standing(
    request: Request[Any, Any, Any], principal: Principal, vault_id: str
) -> Standing:
    """The standing the request's key gives in the vault (relay.domain.grant_roles)."""
    account = None
    if principal.account_id is not None:
        pool = relay_state(request).require_pool()
        account = await owners.standing(pool, vault_id, principal.account_id)
    return grant_roles.key_standing(principal, vault_id, account)


async def authorize_owner(request: Request[Any, Any, Any], vault_id: str, what: str) -> Principal:
    """`authorize` with an admin key, then PROTOCOL §13: only the vault's owner (an operator
    key, or a key of the owning account) may go on; 403 `owner_only` for an admin grant."""
    principal = await authorize(request, vault_id, admin=True)
    grant_roles.require_owner(await standing(request, principal, vault_id), vault_id, what)
    return principal


# --- PROTOCOL §13: account sessions, the second kind of bearer token -----------------------
# Session tokens (`ses_…`) authenticate the /account routes only; API keys do not work there,
# and session tokens are unknown keys on the vault routes (401), except where a route says
# otherwise (creating pairing codes accepts the session of an account that owns the vault).

SESSION_RATE = DEFAULT_KEY_RATE  # requests/second per account, like a key


def bearer_is_session(request: Request[Any, Any, Any]) -> bool:
    """True when the request's bearer token is shaped like a session token."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and token.strip().startswith(SESSION_PREFIX)


def _session_unauthorized(message: str) -> RelayError:
    return RelayError(
        401,
        "unauthorized",
        f"{message}: sign in with POST /auth/signin and send "
        "`Authorization: Bearer <session token>`",
        headers={"WWW-Authenticate": "Bearer"},
    )


async def authenticate_session(request: Request[Any, Any, Any]) -> AccountSession:
    """The live session of the request's bearer token, rate limited per account; 401/429."""
    state = relay_state(request)
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise _session_unauthorized("missing session token")
    if not token.startswith(SESSION_PREFIX):
        raise _session_unauthorized("API keys do not work on account routes")
    session = await account_store.find_session(state.require_pool(), token)
    if session is None:
        raise _session_unauthorized("unknown or expired session token")
    wait = state.limiter.take("session:" + session.account_id, SESSION_RATE)
    if wait > 0:
        raise RelayError(
            429,
            "rate_limited",
            f"rate limit of {SESSION_RATE} requests/second exceeded; retry later",
            headers={"Retry-After": state.limiter.retry_after_header(wait)},
        )
    request.state.key_prefix = key_prefix(token)
    return session
