"""Minted API keys in the database (PROTOCOL §5, §10): stored only as SHA-256."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import asyncpg

from engram_sync.relay.domain.api_keys import Principal, hash_key, key_prefix, mint_key, new_key_id
from engram_sync.relay.store.feed_notify import announce_revocation


@dataclass(frozen=True)
class KeyRecord:
    """A minted key as listed to an operator (never the key itself)."""

    id: str
    prefix: str
    vault_id: str | None
    is_admin: bool
    device_id: str | None
    rate_per_sec: int
    label: str | None
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True)
class KeyLookup:
    """The result of looking a presented key up."""

    principal: Principal
    revoked: bool
    device_revoked: bool


async def create_key(
    conn: asyncpg.Connection | asyncpg.Pool,
    *,
    vault_id: str | None,
    is_admin: bool,
    device_id: str | None = None,
    rate: int = 100,
    label: str | None = None,
) -> tuple[str, str]:
    """Mint and store an operator key; returns (key id, the key text — shown once, never
    stored). A key for a vault nobody has used claims it for the operator (PROTOCOL §13),
    in the same statement; a vault an account owns stays the account's (the CLI asks
    for --force first, relay.cli.vaults)."""
    return await insert_api_key(
        conn,
        vault_id=vault_id,
        is_admin=is_admin,
        device_id=device_id,
        rate=rate,
        label=label,
        account_id=None,
        claim_for_operator=True,
    )


# PROTOCOL §13: a key for a vault nobody owns claims it for the operator, in the same statement.
_CLAIM_FOR_OPERATOR = (
    "WITH claim AS (INSERT INTO vault_owners (vault_id, owner) SELECT $4, 'operator'"
    " WHERE $4::text IS NOT NULL ON CONFLICT (vault_id) DO NOTHING) "
)
_INSERT_KEY = (
    "INSERT INTO api_keys (id, key_hash, prefix, vault_id, is_admin, device_id,"
    " rate_per_sec, label, account_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
)


async def insert_api_key(
    conn: asyncpg.Connection | asyncpg.Pool,
    *,
    vault_id: str | None,
    is_admin: bool,
    device_id: str | None,
    rate: int,
    label: str | None,
    account_id: str | None,
    claim_for_operator: bool,
) -> tuple[str, str]:
    """The one INSERT of api_keys: mint a key (PROTOCOL §5 format) and store its hash and
    prefix; returns (key id, the key text — shown once, never stored). `claim_for_operator`
    is the operator path of `create_key`; account keys (relay.store.accounts) check
    ownership themselves."""
    key, key_id = mint_key(), new_key_id()
    await conn.execute(
        (_CLAIM_FOR_OPERATOR if claim_for_operator else "") + _INSERT_KEY,
        key_id,
        hash_key(key),
        key_prefix(key),
        vault_id,
        is_admin,
        device_id,
        rate,
        label,
        account_id,
    )
    return key_id, key


async def lookup(pool: asyncpg.Pool, key: str) -> KeyLookup | None:
    """Find a minted key by its hash, with its device's revocation state."""
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            """
            SELECT k.id, k.prefix, k.vault_id, k.is_admin, k.device_id, k.rate_per_sec,
                   k.account_id,
                   k.revoked_at IS NOT NULL AS revoked,
                   coalesce(d.revoked_at IS NOT NULL, false) AS device_revoked
            FROM api_keys k
            LEFT JOIN devices d ON d.vault_id = k.vault_id AND d.device_id = k.device_id
            WHERE k.key_hash = $1
            """,
            hash_key(key),
        )
    if row is None:
        return None
    vaults = None if row["vault_id"] is None else frozenset({row["vault_id"]})
    principal = Principal(
        key_id=row["id"],
        prefix=row["prefix"],
        rate=row["rate_per_sec"],
        vaults=vaults,
        admin_vaults=(None if row["is_admin"] else frozenset()),
        device_id=row["device_id"],
        account_id=row["account_id"],
    )
    return KeyLookup(principal, row["revoked"], row["device_revoked"])


async def list_keys(conn: asyncpg.Connection | asyncpg.Pool) -> list[KeyRecord]:
    """Every minted key, newest first."""
    rows = await conn.fetch(
        "SELECT id, prefix, vault_id, is_admin, device_id, rate_per_sec, label, created_at,"
        " revoked_at FROM api_keys ORDER BY created_at DESC, id"
    )
    return [KeyRecord(**dict(r)) for r in rows]


async def revoke_key(conn: asyncpg.Connection | asyncpg.Pool, key_id: str) -> bool:
    """Revoke a key by id; False when no such key exists."""
    rows = await conn.fetch(
        # least() skips NULL: the first revocation's time stays (Citus refuses now() in
        # coalesce: deploy/SCALING.md §3).
        "UPDATE api_keys SET revoked_at = least(revoked_at, now()) WHERE id = $1"
        " RETURNING vault_id",
        key_id,
    )
    for row in rows:  # PROTOCOL §15: the key's event streams end (autocommit: committed)
        if row["vault_id"] is not None:
            await announce_revocation(conn, row["vault_id"])
    return bool(rows)


#: how long an account's revoked key is kept (ours) for its owner's key list; a revoked key
#: is refused like an unknown one (401) either way. An account's mint/revoke loop no longer
#: grows the table for ever (maintenance, relay.services.maintenance). Operator keys stay:
#: they are few, and `count_keys` must never fall back to 0 (a new first admin key)
REVOKED_KEY_KEPT: Final = timedelta(days=30)


async def purge_revoked_keys(
    conn: asyncpg.Connection | asyncpg.Pool, kept: timedelta = REVOKED_KEY_KEPT
) -> int:
    """Delete the accounts' keys revoked more than `kept` ago; returns how many."""
    status: str = await conn.execute(
        "DELETE FROM api_keys WHERE account_id IS NOT NULL AND revoked_at < now() - $1::interval",
        kept,
    )
    return int(status.split()[-1])


async def count_keys(conn: asyncpg.Connection | asyncpg.Pool) -> int:
    """Number of minted keys, revoked included (used to mint the first admin key once)."""
    return int(await conn.fetchval("SELECT count(*) FROM api_keys"))
