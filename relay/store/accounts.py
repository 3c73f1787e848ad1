"""Accounts, sessions, key wraps and account-owned keys in the database (PROTOCOL §13).

The relay keeps only: the login hash, SHA-256 of session tokens, opaque wraps
and salts, SHA-256 of the recovery proof, and SHA-256 of minted keys.

Vault ownership (PROTOCOL §13, relay/store/owners.py): an account's first key or
wrap for an unused vault id claims it; a vault the operator or another account
owns needs a grant by an admin of it (storing a wrap with an admin key of the
vault records one), so storing a wrap or minting a key can never grant access to
someone else's vault.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, TypeAlias

import asyncpg

from engram_sync.relay.domain.grant_roles import MEMBER, Role
from engram_sync.relay.store import owners
from engram_sync.relay.store.feed_notify import announce_revocation
from engram_sync.relay.store.minted_keys import insert_api_key
from engram_sync.shared_format.b64 import b64url_encode

SESSION_PREFIX: Final = "ses_"
SESSION_TTL: Final = timedelta(days=30)
DEFAULT_ACCOUNT_KEY_RATE: Final = 100

Conn: TypeAlias = asyncpg.Connection | asyncpg.Pool


@dataclass(frozen=True)
class AccountSession:
    """An authenticated session: the account and the hash of its token."""

    account_id: str
    token_hash: bytes
    expires_at: datetime


@dataclass(frozen=True)
class Login:
    """What sign-in needs to check a password."""

    account_id: str
    password_hash: str


@dataclass(frozen=True)
class AccountRow:
    """The account itself (never its hash)."""

    account_id: str
    email: str
    created_at: datetime


@dataclass(frozen=True)
class AccountKey:
    """A key minted for the account (never the key itself)."""

    id: str
    prefix: str
    vault_id: str | None
    device_id: str | None
    is_admin: bool
    label: str | None
    created_at: datetime
    revoked: bool


@dataclass(frozen=True)
class Wraps:
    """The account's wraps of A; None where not set."""

    wrapped_a: str | None
    salt_pw: str | None
    wrapped_a_rec: str | None
    salt_rec: str | None
    updated_at: datetime


@dataclass(frozen=True)
class RecoveryRecord:
    """What recovery needs: the recovery wrap and the verifier of its proof."""

    account_id: str
    wrapped_a_rec: str
    salt_rec: str
    verifier: bytes
    updated_at: datetime


def new_account_id() -> str:
    """A public account id."""
    return "acct_" + secrets.token_hex(8)


def hash_token(token: str) -> bytes:
    """SHA-256 of a session token's text: the only form in which it is stored."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


# --- accounts and sessions -------------------------------------------------------------


async def create_account(conn: Conn, email: str, password_hash: str) -> AccountRow | None:
    """Insert an account; None when the email is taken."""
    row = await conn.fetchrow(
        "INSERT INTO accounts (id, email, password_hash) VALUES ($1, $2, $3)"
        " ON CONFLICT (email) DO NOTHING RETURNING id, email, created_at",
        new_account_id(),
        email,
        password_hash,
    )
    return None if row is None else AccountRow(row["id"], row["email"], row["created_at"])


async def find_login(conn: Conn, email: str) -> Login | None:
    """The account id and login hash for an email, if any."""
    row = await conn.fetchrow("SELECT id, password_hash FROM accounts WHERE email = $1", email)
    return None if row is None else Login(row["id"], row["password_hash"])


async def login_hash(conn: Conn, account_id: str) -> str | None:
    """The login hash of an account (to confirm its password)."""
    value: str | None = await conn.fetchval(
        "SELECT password_hash FROM accounts WHERE id = $1", account_id
    )
    return value


async def set_login_hash(conn: Conn, account_id: str, password_hash: str) -> None:
    """Replace the login hash (password change, rehash, recovery)."""
    await conn.execute(
        "UPDATE accounts SET password_hash = $2 WHERE id = $1", account_id, password_hash
    )


async def create_session(conn: Conn, account_id: str) -> tuple[str, datetime]:
    """A new session; returns (token — shown once, its expiry)."""
    token = SESSION_PREFIX + b64url_encode(secrets.token_bytes(32))
    expires_at: datetime = await conn.fetchval(
        "INSERT INTO sessions (token_hash, account_id, expires_at) VALUES ($1, $2, now() + $3)"
        " RETURNING expires_at",
        hash_token(token),
        account_id,
        SESSION_TTL,
    )
    return token, expires_at


async def find_session(conn: Conn, token: str) -> AccountSession | None:
    """The live session of a token, if any."""
    token_hash = hash_token(token)
    row = await conn.fetchrow(
        "SELECT account_id, expires_at FROM sessions WHERE token_hash = $1 AND expires_at > now()",
        token_hash,
    )
    return None if row is None else AccountSession(row["account_id"], token_hash, row["expires_at"])


async def end_session(conn: Conn, token_hash: bytes) -> None:
    """Revoke one session (logout)."""
    await conn.execute("DELETE FROM sessions WHERE token_hash = $1", token_hash)


async def end_sessions(conn: Conn, account_id: str, *, keep: bytes | None = None) -> int:
    """Revoke every session of the account except `keep`; returns how many."""
    status: str = await conn.execute(
        "DELETE FROM sessions WHERE account_id = $1 AND token_hash IS DISTINCT FROM $2",
        account_id,
        keep,
    )
    return int(status.split()[-1])


async def account(conn: Conn, account_id: str) -> AccountRow | None:
    """The account row."""
    row = await conn.fetchrow(
        "SELECT id, email, created_at FROM accounts WHERE id = $1", account_id
    )
    return None if row is None else AccountRow(row["id"], row["email"], row["created_at"])


# --- wraps of A --------------------------------------------------------------------------


async def wraps(conn: Conn, account_id: str) -> Wraps | None:
    """The account's wraps of A (None when it never stored one)."""
    row = await conn.fetchrow(
        "SELECT wrapped_a, salt_pw, wrapped_a_rec, salt_rec, updated_at FROM account_wraps"
        " WHERE account_id = $1",
        account_id,
    )
    return None if row is None else Wraps(**dict(row))


async def put_password_wrap(conn: Conn, account_id: str, wrapped_a: str, salt_pw: str) -> None:
    """Store or replace the password wrap of A."""
    await conn.execute(
        "INSERT INTO account_wraps (account_id, wrapped_a, salt_pw) VALUES ($1, $2, $3)"
        " ON CONFLICT (account_id) DO UPDATE"
        " SET wrapped_a = $2, salt_pw = $3, updated_at = EXCLUDED.updated_at",
        account_id,
        wrapped_a,
        salt_pw,
    )


async def put_recovery_wrap(
    conn: Conn, account_id: str, wrapped_a_rec: str, salt_rec: str, verifier: bytes
) -> None:
    """Store or replace the recovery wrap of A with the verifier of its proof."""
    await conn.execute(
        "INSERT INTO account_wraps (account_id, wrapped_a_rec, salt_rec, rec_verifier)"
        " VALUES ($1, $2, $3, $4) ON CONFLICT (account_id) DO UPDATE"
        " SET wrapped_a_rec = $2, salt_rec = $3, rec_verifier = $4,"
        " updated_at = EXCLUDED.updated_at",
        account_id,
        wrapped_a_rec,
        salt_rec,
        verifier,
    )


async def recovery_record(conn: Conn, email: str) -> RecoveryRecord | None:
    """The recovery wrap and verifier of the account with this email, if it has one."""
    row = await conn.fetchrow(
        "SELECT a.id, w.wrapped_a_rec, w.salt_rec, w.rec_verifier, w.updated_at FROM accounts a"
        " JOIN account_wraps w ON w.account_id = a.id"
        " WHERE a.email = $1 AND w.rec_verifier IS NOT NULL",
        email,
    )
    if row is None:
        return None
    return RecoveryRecord(
        row["id"], row["wrapped_a_rec"], row["salt_rec"], row["rec_verifier"], row["updated_at"]
    )


# --- wraps of vault keys (ownership) -------------------------------------------------------


async def vault_ids(conn: Conn, account_id: str) -> list[str]:
    """Vaults the account holds a wrap for."""
    rows = await conn.fetch(
        "SELECT vault_id FROM vault_wraps WHERE account_id = $1 ORDER BY vault_id", account_id
    )
    return [r["vault_id"] for r in rows]


async def owns_vault(conn: Conn, account_id: str, vault_id: str) -> bool:
    """True when the account owns the vault or was granted it (PROTOCOL §13)."""
    return await owners.may_use(conn, account_id, vault_id)


async def vault_wrap(conn: Conn, account_id: str, vault_id: str) -> tuple[str, datetime] | None:
    """(wrapped_k, updated_at) of one vault, if stored."""
    row = await conn.fetchrow(
        "SELECT wrapped_k, updated_at FROM vault_wraps WHERE account_id = $1 AND vault_id = $2",
        account_id,
        vault_id,
    )
    return None if row is None else (row["wrapped_k"], row["updated_at"])


async def put_vault_wrap(
    pool: asyncpg.Pool,
    account_id: str,
    vault_id: str,
    wrapped_k: str,
    *,
    adopted_by: str | None = None,
    adopted_role: Role = MEMBER,
) -> datetime:
    """Store or replace a vault wrap; the first use of the id claims it (PROTOCOL §13).

    A vault the operator or another account owns needs a grant, or `adopted_by`
    ("key:<id>" of an admin key of the vault), which is recorded as a grant of
    `adopted_role` (never lowering an admin grant);
    owners.VaultOwnedError otherwise. The claim and the write share one transaction.
    """
    async with pool.acquire() as conn, conn.transaction():
        if adopted_by is None:
            await owners.claim_for_account(conn, account_id, vault_id)
        elif (await owners.claim(conn, vault_id, account_id)).account_id != account_id:
            await owners.grant(
                conn, vault_id, account_id, adopted_by, adopted_role, never_lower=True
            )
        updated: datetime = await conn.fetchval(
            "INSERT INTO vault_wraps (account_id, vault_id, wrapped_k) VALUES ($1, $2, $3)"
            " ON CONFLICT (account_id, vault_id) DO UPDATE"
            " SET wrapped_k = $3, updated_at = EXCLUDED.updated_at RETURNING updated_at",
            account_id,
            vault_id,
            wrapped_k,
        )
        return updated


async def delete_vault_wrap(conn: Conn, account_id: str, vault_id: str) -> bool:
    """Forget a vault wrap and the account's passkey wraps of the same K (docs/web-vault.md:
    a closed vault opens with no passkey either); False when there was no vault wrap.
    Ownership and grants stay (an id set free could be squatted)."""
    await conn.execute(
        "DELETE FROM passkey_wraps WHERE account_id = $1 AND vault_id = $2", account_id, vault_id
    )
    status: str = await conn.execute(
        "DELETE FROM vault_wraps WHERE account_id = $1 AND vault_id = $2", account_id, vault_id
    )
    return status.split()[-1] != "0"


# --- keys minted for the account -----------------------------------------------------------


async def insert_key(
    conn: Conn,
    *,
    vault_id: str,
    is_admin: bool,
    device_id: str | None,
    account_id: str | None,
    label: str | None,
    rate: int = DEFAULT_ACCOUNT_KEY_RATE,
) -> tuple[str, str]:
    """Mint a key (PROTOCOL §5 format) owned by `account_id`; returns (id, key — shown once)."""
    return await insert_api_key(
        conn,
        vault_id=vault_id,
        is_admin=is_admin,
        device_id=device_id,
        rate=rate,
        label=label,
        account_id=account_id,
        claim_for_operator=False,
    )


async def replace_device_keys(conn: Conn, account_id: str, vault_id: str, device_id: str) -> int:
    """Revoke the account's keys bound to `device_id` in `vault_id` (a key minted for that
    device again replaces them: a browser unlocking as the same device each time leaves one
    key, not one per unlock); returns how many. Their event streams end (PROTOCOL §15)."""
    rows = await conn.fetch(
        "UPDATE api_keys SET revoked_at = now() WHERE account_id = $1 AND vault_id = $2"
        " AND device_id = $3 AND revoked_at IS NULL RETURNING id",
        account_id,
        vault_id,
        device_id,
    )
    if rows:
        await announce_revocation(conn, vault_id)
    return len(rows)


async def active_key_count(conn: Conn, account_id: str) -> int:
    """The account's keys not revoked (the bound MAX_ACTIVE_KEYS holds)."""
    count: int = await conn.fetchval(
        "SELECT count(*) FROM api_keys WHERE account_id = $1 AND revoked_at IS NULL", account_id
    )
    return count


async def device_revoked(conn: Conn, vault_id: str, device_id: str) -> bool:
    """True when the device was revoked in this vault."""
    found: bool = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM devices WHERE vault_id = $1 AND device_id = $2"
        " AND revoked_at IS NOT NULL)",
        vault_id,
        device_id,
    )
    return found


async def account_keys(conn: Conn, account_id: str) -> list[AccountKey]:
    """Keys minted for the account (newest first), never the keys themselves."""
    rows = await conn.fetch(
        "SELECT id, prefix, vault_id, device_id, is_admin, label, created_at,"
        " revoked_at IS NOT NULL AS revoked FROM api_keys WHERE account_id = $1"
        " ORDER BY created_at DESC, id",
        account_id,
    )
    return [AccountKey(**dict(r)) for r in rows]


async def revoke_account_key(conn: Conn, account_id: str, key_id: str) -> bool:
    """Revoke one of the account's keys (idempotent); False when it is not the account's."""
    rows = await conn.fetch(
        # least() skips NULL: the first revocation's time stays. (Citus refuses now()
        # inside coalesce or CASE: deploy/SCALING.md §3.)
        "UPDATE api_keys SET revoked_at = least(revoked_at, now())"
        " WHERE id = $1 AND account_id = $2 RETURNING vault_id",
        key_id,
        account_id,
    )
    for row in rows:  # PROTOCOL §15: the key's event streams end (autocommit: committed)
        if row["vault_id"] is not None:
            await announce_revocation(conn, row["vault_id"])
    return bool(rows)


# --- expiry ------------------------------------------------------------------------------


async def purge_expired_sessions(conn: Conn) -> int:
    """Delete expired sessions; returns how many."""
    status: str = await conn.execute("DELETE FROM sessions WHERE expires_at <= now()")
    return int(status.split()[-1])
