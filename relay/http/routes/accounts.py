"""Accounts, sessions and key wraps (PROTOCOL §13), plus helpers the pairing and handoff
routes share (strict body decoding, per-IP limits, field validation).

Auth: `/auth/*` needs none (rate limited per client IP); `/account/*` needs a
session token (`Authorization: Bearer ses_…`) — API keys are refused there.
Every write or delete of a wrap needs the current `password` in the body, so a
stolen session cannot lock the owner out; recovery instead proves knowledge of
the recovery phrase (see `recover` and shared_format/recovery_proof.py).
Passwords, tokens, wraps and proofs are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Any, Final, TypeVar

import asyncpg
from litestar import Request, delete, get, post, put
from litestar.params import FromPath
from msgspec import UNSET

from engram_sync.relay.domain import grant_roles
from engram_sync.relay.domain.api_keys import hash_key
from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.auth import authenticate_session, standing
from engram_sync.relay.http.bodies import BODY_OPT, decode_body
from engram_sync.relay.http.client_ip import client_ip
from engram_sync.relay.http.errors import RelayError, forbidden
from engram_sync.relay.http.routes.account_support import (
    check_label,
    confirm_password,
    email_bucket,
    invalid_credentials,
    limit_per_minute,
    no_wrap,
    normal_email,
    salt_b64,
    std_b64,
    strong_password,
    wrap_b64,
)
from engram_sync.relay.http.routes.ids import require_id
from engram_sync.relay.http.routes.once import Once
from engram_sync.relay.services import passwords
from engram_sync.relay.store import accounts as store
from engram_sync.relay.store import minted_keys as key_store
from engram_sync.relay.store import owners
from engram_sync.relay.store import retire as retirement
from engram_sync.shared_format.timestamps import format_rfc3339
from engram_sync.shared_format.wire import (
    AccountCreated,
    AccountInfo,
    AccountKeyInfo,
    AccountKeyRevoked,
    AccountWraps,
    LoggedOut,
    MintAccountKeyRequest,
    MintedAccountKey,
    PasswordConfirmation,
    PasswordWrap,
    PasswordWrapWrite,
    RecoverRequest,
    RecoverStartRequest,
    RecoveryWrap,
    RecoveryWrapWrite,
    SessionIssued,
    SigninRequest,
    SignupRequest,
    VaultWrap,
    VaultWrapDeleted,
    VaultWrapWrite,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

PROOF_LEN: Final = 32
ADOPT_HEADER: Final = "x-engram-vault-key"
# Per-IP token buckets: requests per minute, burst equal to the rate.
SIGNUP_PER_MINUTE: Final = 10
SIGNIN_PER_MINUTE: Final = 30
# Sign-ins per email, whether or not an account has it (so the limit reveals nothing), in a
# bucket of its own: a flood against one account never limits another (issue 14 item 7).
SIGNIN_PER_ACCOUNT_PER_MINUTE: Final = 10
RECOVER_PER_MINUTE: Final = 10
REDEEM_PER_MINUTE: Final = 30

_DUMMY_VERIFIER: Final = bytes(32)


# --- /auth ---------------------------------------------------------------------------------


@post("/auth/signup", status_code=200, tags=["accounts"], opt={BODY_OPT: SignupRequest})
async def signup(request: Request[Any, Any, Any]) -> AccountCreated:
    """Create an account and sign it in (PROTOCOL §13); 409 `email_taken`.

    With an `Idempotency-Key`, a repeat answers the first sign-up's answer (docs/retries.md).
    """
    limit_per_minute(request, f"signup:{client_ip(request)}", SIGNUP_PER_MINUTE)
    data = await decode_body(request, SignupRequest)
    once = await Once.of(request, scope="anonymous")
    replayed = await once.replay(AccountCreated)
    if replayed is not None:
        return replayed
    email = normal_email(data.email)
    password_hash = await passwords.hash_password(strong_password(data.password, "password"))

    async def create(conn: asyncpg.Connection) -> AccountCreated:
        created = await store.create_account(conn, email, password_hash)
        if created is None:
            raise RelayError(
                409, "email_taken", "an account with this email exists: sign in instead"
            )
        token, expires_at = await store.create_session(conn, created.account_id)
        log.info("account created", extra={"account_id": created.account_id})
        return AccountCreated(
            account_id=created.account_id,
            email=created.email,
            created_at=format_rfc3339(created.created_at),
            session_token=token,
            expires_at=format_rfc3339(expires_at),
        )

    return await once.run(AccountCreated, create)


@post("/auth/signin", status_code=200, tags=["accounts"], opt={BODY_OPT: SigninRequest})
async def signin(request: Request[Any, Any, Any]) -> SessionIssued:
    """A new session for email + password; one 401 `invalid_credentials` for any failure."""
    limit_per_minute(request, f"signin:{client_ip(request)}", SIGNIN_PER_MINUTE)
    data = await decode_body(request, SigninRequest)
    email = data.email.strip().lower()
    limit_per_minute(request, f"signin-email:{email_bucket(email)}", SIGNIN_PER_ACCOUNT_PER_MINUTE)
    passwords.check_capacity()  # a flood is shed before its database lookup
    pool = relay_state(request).require_pool()
    login = await store.find_login(pool, email)
    # Unknown email: verify against a dummy hash, so it costs what a wrong password costs.
    if not await passwords.verify_password(login.password_hash if login else None, data.password):
        raise invalid_credentials()
    assert login is not None
    if passwords.needs_rehash(login.password_hash):
        await store.set_login_hash(
            pool, login.account_id, await passwords.hash_password(data.password)
        )
    token, expires_at = await store.create_session(pool, login.account_id)
    return SessionIssued(
        account_id=login.account_id, session_token=token, expires_at=format_rfc3339(expires_at)
    )


@post("/auth/logout", status_code=200, tags=["accounts"])
async def logout(request: Request[Any, Any, Any]) -> LoggedOut:
    """End the session whose token authenticates this request."""
    session = await authenticate_session(request)
    await store.end_session(relay_state(request).require_pool(), session.token_hash)
    return LoggedOut()


@post(
    "/auth/recover/start", status_code=200, tags=["accounts"], opt={BODY_OPT: RecoverStartRequest}
)
async def recover_start(request: Request[Any, Any, Any]) -> RecoveryWrap:
    """The recovery wrap of an email's account, to open with the phrase (no auth).

    Safe to hand out: opening it needs the 12-word phrase (128 bits) through
    Argon2id. 404 `recovery_unavailable` for an unknown email or no recovery wrap.
    """
    limit_per_minute(request, f"recover:{client_ip(request)}", RECOVER_PER_MINUTE)
    data = await decode_body(request, RecoverStartRequest)
    pool = relay_state(request).require_pool()
    record = await store.recovery_record(pool, data.email.strip().lower())
    if record is None:
        raise RelayError(404, "recovery_unavailable", "no recovery wrap is stored for this email")
    return RecoveryWrap(
        wrapped_a_rec=record.wrapped_a_rec,
        salt_rec=record.salt_rec,
        updated_at=format_rfc3339(record.updated_at),
    )


@post("/auth/recover", status_code=200, tags=["accounts"], opt={BODY_OPT: RecoverRequest})
async def recover(request: Request[Any, Any, Any]) -> SessionIssued:
    """Set a new password with the recovery phrase: our design for §13 recovery.

    The client opens the recovery wrap with the phrase (`/auth/recover/start`),
    re-wraps the same A under the new password, and proves it holds the phrase
    with `proof` = HMAC-SHA256(recovery wrap key, "engram-recovery-proof-v1").
    The relay stored only SHA-256(proof) (`recovery_verifier`, written with the
    recovery wrap under the then-current password) and compares in constant
    time; it never sees the phrase, the wrap key or A. On success, in one
    transaction: new login hash, new password wrap, every session ended; the
    answer is a fresh session. 403 `recovery_failed` for any mismatch.
    """
    limit_per_minute(request, f"recover:{client_ip(request)}", RECOVER_PER_MINUTE)
    data = await decode_body(request, RecoverRequest)
    proof = std_b64(data.proof, "proof", PROOF_LEN, PROOF_LEN)
    wrapped_a, salt_pw = wrap_b64(data.wrapped_a, "wrapped_a"), salt_b64(data.salt_pw, "salt_pw")
    password_hash = await passwords.hash_password(
        strong_password(data.new_password, "new_password")
    )
    pool = relay_state(request).require_pool()
    record = await store.recovery_record(pool, data.email.strip().lower())
    expected = record.verifier if record else _DUMMY_VERIFIER
    matches = hmac.compare_digest(hashlib.sha256(proof).digest(), expected)
    if record is None or not matches:
        raise forbidden(
            "recovery failed: the proof does not match this account's recovery phrase",
            code="recovery_failed",
        )
    async with pool.acquire() as conn, conn.transaction():
        await store.set_login_hash(conn, record.account_id, password_hash)
        await store.put_password_wrap(conn, record.account_id, wrapped_a, salt_pw)
        ended = await store.end_sessions(conn, record.account_id)
        token, expires_at = await store.create_session(conn, record.account_id)
    log.info("account recovered", extra={"account_id": record.account_id, "sessions_ended": ended})
    return SessionIssued(
        account_id=record.account_id, session_token=token, expires_at=format_rfc3339(expires_at)
    )


# --- /account --------------------------------------------------------------------------------


@get("/account", tags=["accounts"])
async def get_account(request: Request[Any, Any, Any]) -> AccountInfo:
    """The account, the vaults it holds wraps for (owns), and its keys (never the keys)."""
    session = await authenticate_session(request)
    pool = relay_state(request).require_pool()
    row = await store.account(pool, session.account_id)
    if row is None:  # deleted under a live session
        raise RelayError(401, "unauthorized", "this account no longer exists")
    keys = await store.account_keys(pool, session.account_id)
    return AccountInfo(
        account_id=row.account_id,
        email=row.email,
        created_at=format_rfc3339(row.created_at),
        vaults=await store.vault_ids(pool, session.account_id),
        keys=[
            AccountKeyInfo(
                id=k.id,
                prefix=k.prefix,
                vault_id=k.vault_id,
                device_id=k.device_id,
                is_admin=k.is_admin,
                label=k.label,
                created_at=format_rfc3339(k.created_at),
                revoked=k.revoked,
            )
            for k in keys
        ],
    )


#: keys an account may hold unrevoked, across its vaults (every resource has a bound per
#: account); a device minting again replaces its own key, so re-unlocks do not count up
MAX_ACTIVE_KEYS: Final = 200


@post("/account/keys", status_code=200, tags=["accounts"], opt={BODY_OPT: MintAccountKeyRequest})
async def mint_account_key(request: Request[Any, Any, Any]) -> MintedAccountKey:
    """Mint a key for a vault the account owns or was granted; shown once.

    PROTOCOL §13: the first key for an unused vault id claims it for the account; a
    vault the operator or another account owns is 403 `vault_owned`. With `admin` left
    out, an admin key (it may revoke devices and seal handoffs) for the owner and an admin
    grant, a member key for a member grant; `admin: true` with a member grant is 403
    `admin_not_granted` (relay.domain.grant_roles, "Grants carry a role"). Bound to
    `device_id` if given (§10); a key minted again for a device replaces (revokes) the
    account's older keys of that device and vault. At most MAX_ACTIVE_KEYS unrevoked keys
    an account: past it 409 `too_many_keys`. With an `Idempotency-Key`, a repeat answers the
    key the first request minted, and mints none (docs/retries.md).
    """
    session = await authenticate_session(request)
    data = await decode_body(request, MintAccountKeyRequest)
    vault_id = require_id(data.vault_id, "vault_id")
    device_id = None if data.device_id is None else require_id(data.device_id, "device_id")
    label = check_label(data.label)
    once = await Once.of(request, scope=f"account:{session.account_id}")

    async def mint(conn: asyncpg.Connection) -> MintedAccountKey:
        # The claim and the key are one transaction: a refusal below rolls the claim back.
        standing = await owners.claim_for_account(conn, session.account_id, vault_id)
        asked = None if data.admin is UNSET else data.admin
        is_admin = grant_roles.minted_key_is_admin(asked, standing, vault_id)  # §13 roles
        await retirement.refuse_if_retired(conn, vault_id)  # PROTOCOL §19: 410 vault_retired
        if device_id is not None and await store.device_revoked(conn, vault_id, device_id):
            raise forbidden(f"device {device_id} was revoked for this vault", code="device_revoked")
        if device_id is not None:  # one key a device: a new one replaces the device's old ones
            await store.replace_device_keys(conn, session.account_id, vault_id, device_id)
        if await store.active_key_count(conn, session.account_id) >= MAX_ACTIVE_KEYS:
            raise RelayError(
                409,
                "too_many_keys",
                f"this account holds {MAX_ACTIVE_KEYS} keys not revoked, the most it may: "
                "revoke the ones no device uses (DELETE /account/keys/{id})",
            )
        key_id, key = await store.insert_key(
            conn,
            vault_id=vault_id,
            is_admin=is_admin,
            device_id=device_id,
            account_id=session.account_id,
            label=label,
        )
        log.info("account key minted", extra={"account_id": session.account_id, "key_id": key_id})
        return MintedAccountKey(
            id=key_id,
            key=key,
            prefix=key[:8],
            vault_id=vault_id,
            device_id=device_id,
            is_admin=is_admin,
            label=label,
        )

    return await once.run(MintedAccountKey, mint)


@delete("/account/keys/{key_id:str}", status_code=200, tags=["accounts"])
async def revoke_account_key(
    request: Request[Any, Any, Any], key_id: FromPath[str]
) -> AccountKeyRevoked:
    """Revoke one of the account's keys (idempotent); 404 for a key that is not its own."""
    session = await authenticate_session(request)
    pool = relay_state(request).require_pool()
    if not await store.revoke_account_key(pool, session.account_id, key_id):
        raise RelayError(404, "not_found", "this account has no key with this id")
    return AccountKeyRevoked(id=key_id)


@get("/account/wraps", tags=["accounts"])
async def get_wraps(request: Request[Any, Any, Any]) -> AccountWraps:
    """Both wraps of A (null where not stored)."""
    session = await authenticate_session(request)
    w = await store.wraps(relay_state(request).require_pool(), session.account_id)
    if w is None:
        return AccountWraps(None, None, None, None, None)
    return AccountWraps(
        w.wrapped_a, w.salt_pw, w.wrapped_a_rec, w.salt_rec, format_rfc3339(w.updated_at)
    )


@get("/account/wraps/password", tags=["accounts"])
async def get_password_wrap(request: Request[Any, Any, Any]) -> PasswordWrap:
    """The password wrap of A; 404 `no_wrap` if none."""
    session = await authenticate_session(request)
    w = await store.wraps(relay_state(request).require_pool(), session.account_id)
    if w is None or w.wrapped_a is None or w.salt_pw is None:
        raise no_wrap("password wrap")
    return PasswordWrap(w.wrapped_a, w.salt_pw, format_rfc3339(w.updated_at))


@put("/account/wraps/password", tags=["accounts"], opt={BODY_OPT: PasswordWrapWrite})
async def put_password_wrap(request: Request[Any, Any, Any]) -> PasswordWrap:
    """Store the password wrap of A (current `password` required).

    With `new_password`, this is a password change: the login hash and the wrap
    change in one transaction and every other session ends.
    """
    session = await authenticate_session(request)
    data = await decode_body(request, PasswordWrapWrite)
    wrapped_a, salt_pw = wrap_b64(data.wrapped_a, "wrapped_a"), salt_b64(data.salt_pw, "salt_pw")
    new_hash = None
    if data.new_password is not None:
        new_hash = await passwords.hash_password(strong_password(data.new_password, "new_password"))
    await confirm_password(request, session, data.password)
    async with relay_state(request).require_pool().acquire() as conn, conn.transaction():
        await store.put_password_wrap(conn, session.account_id, wrapped_a, salt_pw)
        if new_hash is not None:
            await store.set_login_hash(conn, session.account_id, new_hash)
            await store.end_sessions(conn, session.account_id, keep=session.token_hash)
        w = await store.wraps(conn, session.account_id)
    assert w is not None
    return PasswordWrap(
        wrapped_a, salt_pw, format_rfc3339(w.updated_at), password_changed=new_hash is not None
    )


@get("/account/wraps/recovery", tags=["accounts"])
async def get_recovery_wrap(request: Request[Any, Any, Any]) -> RecoveryWrap:
    """The recovery wrap of A; 404 `no_wrap` if none."""
    session = await authenticate_session(request)
    w = await store.wraps(relay_state(request).require_pool(), session.account_id)
    if w is None or w.wrapped_a_rec is None or w.salt_rec is None:
        raise no_wrap("recovery wrap")
    return RecoveryWrap(w.wrapped_a_rec, w.salt_rec, format_rfc3339(w.updated_at))


@put("/account/wraps/recovery", tags=["accounts"], opt={BODY_OPT: RecoveryWrapWrite})
async def put_recovery_wrap(request: Request[Any, Any, Any]) -> RecoveryWrap:
    """Store the recovery wrap of A and the verifier of its proof (current `password` required)."""
    session = await authenticate_session(request)
    data = await decode_body(request, RecoveryWrapWrite)
    wrapped, salt = (
        wrap_b64(data.wrapped_a_rec, "wrapped_a_rec"),
        salt_b64(data.salt_rec, "salt_rec"),
    )
    verifier = std_b64(data.recovery_verifier, "recovery_verifier", PROOF_LEN, PROOF_LEN)
    await confirm_password(request, session, data.password)
    pool = relay_state(request).require_pool()
    await store.put_recovery_wrap(pool, session.account_id, wrapped, salt, verifier)
    w = await store.wraps(pool, session.account_id)
    assert w is not None
    return RecoveryWrap(wrapped, salt, format_rfc3339(w.updated_at))


@get("/account/vaults/{vault_id:str}/wrap", tags=["accounts"])
async def get_vault_wrap(request: Request[Any, Any, Any], vault_id: FromPath[str]) -> VaultWrap:
    """The wrap of one vault key K under A; 404 `no_wrap` if none."""
    session = await authenticate_session(request)
    found = await store.vault_wrap(
        relay_state(request).require_pool(), session.account_id, require_id(vault_id, "vault_id")
    )
    if found is None:
        raise no_wrap(f"wrap for vault {vault_id}")
    return VaultWrap(vault_id=vault_id, wrapped_k=found[0], updated_at=format_rfc3339(found[1]))


async def _adopting(
    request: Request[Any, Any, Any], vault_id: str
) -> tuple[str, grant_roles.Role] | None:
    """The grantor ("key:<id>") and the grant's role when `X-Engram-Vault-Key` carries an
    admin key for the vault, None without the header; 403 for any other key. PROTOCOL §13:
    the owner's key grants `admin` (its holder holds the owner's admin key already), an
    admin grant's key grants `member`, a key whose account lost admin grants nothing."""
    key = request.headers.get(ADOPT_HEADER, "").strip()
    if not key:
        return None
    state = relay_state(request)
    principal = state.static_keys.get(hash_key(key))
    if principal is None:
        found = await key_store.lookup(state.require_pool(), key)
        if found is None or found.revoked or found.device_revoked:
            raise forbidden(
                "X-Engram-Vault-Key is not a valid admin key for this vault", code="forbidden"
            )
        principal = found.principal
    if not principal.is_admin_for(vault_id):
        raise forbidden("X-Engram-Vault-Key is not a valid admin key for this vault")
    held = await standing(request, principal, vault_id)
    grant_roles.require_admin(held, vault_id)
    return "key:" + principal.key_id, (grant_roles.ADMIN if held == "owner" else grant_roles.MEMBER)


@put("/account/vaults/{vault_id:str}/wrap", tags=["accounts"], opt={BODY_OPT: VaultWrapWrite})
async def put_vault_wrap(request: Request[Any, Any, Any], vault_id: FromPath[str]) -> VaultWrap:
    """Store the wrap of K under A (current `password` required).

    PROTOCOL §13: the first wrap for an unused vault id claims it for the account; a
    vault the operator or another account owns is 403 `vault_owned`, unless the account
    was granted it or `X-Engram-Vault-Key` carries an admin key for it (which grants it).
    """
    session = await authenticate_session(request)
    require_id(vault_id, "vault_id")
    data = await decode_body(request, VaultWrapWrite)
    wrapped_k = wrap_b64(data.wrapped_k, "wrapped_k")
    adopted = await _adopting(request, vault_id)
    await confirm_password(request, session, data.password)
    updated = await store.put_vault_wrap(
        relay_state(request).require_pool(),
        session.account_id,
        vault_id,
        wrapped_k,
        adopted_by=None if adopted is None else adopted[0],
        adopted_role=grant_roles.MEMBER if adopted is None else adopted[1],
    )
    return VaultWrap(vault_id=vault_id, wrapped_k=wrapped_k, updated_at=format_rfc3339(updated))


@delete(
    "/account/vaults/{vault_id:str}/wrap",
    status_code=200,
    tags=["accounts"],
    opt={BODY_OPT: PasswordConfirmation},
)
async def delete_vault_wrap(
    request: Request[Any, Any, Any], vault_id: FromPath[str]
) -> VaultWrapDeleted:
    """Forget a vault wrap (current `password` required; idempotent). Keys stay valid."""
    session = await authenticate_session(request)
    require_id(vault_id, "vault_id")
    data = await decode_body(request, PasswordConfirmation)
    await confirm_password(request, session, data.password)
    deleted = await store.delete_vault_wrap(
        relay_state(request).require_pool(), session.account_id, vault_id
    )
    return VaultWrapDeleted(vault_id=vault_id, deleted=deleted)


ROUTES: Final = [
    signup,
    signin,
    logout,
    recover_start,
    recover,
    get_account,
    mint_account_key,
    revoke_account_key,
    get_wraps,
    get_password_wrap,
    put_password_wrap,
    get_recovery_wrap,
    put_recovery_wrap,
    get_vault_wrap,
    put_vault_wrap,
    delete_vault_wrap,
]
