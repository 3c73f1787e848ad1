"""Passkey wraps of vault keys in the database (docs/web-vault.md "Passkey unlock", our
addition to PROTOCOL §13): opaque K-wraps and public PRF salts per account, vault and WebAuthn
credential id. The relay cannot open them: the wrap key comes from the passkey's PRF output,
which only the browser sees."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final, TypeAlias

import asyncpg

Conn: TypeAlias = asyncpg.Connection | asyncpg.Pool

#: Passkeys one account may hold for one vault (a bound on rows a session can add).
MAX_PASSKEYS_PER_VAULT: Final = 10


@dataclass(frozen=True)
class PasskeyWrapRow:
    """One stored passkey wrap."""

    credential_id: str
    wrapped_k: str
    prf_salt: str
    updated_at: datetime


class TooManyPasskeysError(Exception):
    """The account holds MAX_PASSKEYS_PER_VAULT passkeys for the vault already."""


async def put(
    pool: asyncpg.Pool,
    account_id: str,
    vault_id: str,
    credential_id: str,
    wrapped_k: str,
    prf_salt: str,
) -> datetime:
    """Store or replace a passkey wrap; TooManyPasskeysError past the cap (a replacement counts
    once). The count and the write share a transaction under a lock of the account's row."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE", account_id)
        others: int = await conn.fetchval(
            "SELECT count(*) FROM passkey_wraps WHERE account_id = $1 AND vault_id = $2"
            " AND credential_id <> $3",
            account_id,
            vault_id,
            credential_id,
        )
        if others >= MAX_PASSKEYS_PER_VAULT:
            raise TooManyPasskeysError
        updated: datetime = await conn.fetchval(
            "INSERT INTO passkey_wraps (account_id, vault_id, credential_id, wrapped_k, prf_salt)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (account_id, vault_id, credential_id)"
            " DO UPDATE SET wrapped_k = $4, prf_salt = $5, updated_at = now()"
            " RETURNING updated_at",
            account_id,
            vault_id,
            credential_id,
            wrapped_k,
            prf_salt,
        )
        return updated


async def get(
    conn: Conn, account_id: str, vault_id: str, credential_id: str
) -> PasskeyWrapRow | None:
    """One passkey wrap of the account, if stored."""
    row = await conn.fetchrow(
        "SELECT credential_id, wrapped_k, prf_salt, updated_at FROM passkey_wraps"
        " WHERE account_id = $1 AND vault_id = $2 AND credential_id = $3",
        account_id,
        vault_id,
        credential_id,
    )
    return None if row is None else PasskeyWrapRow(**dict(row))


async def listed(conn: Conn, account_id: str, vault_id: str) -> list[PasskeyWrapRow]:
    """The account's passkey wraps for the vault, oldest first."""
    rows = await conn.fetch(
        "SELECT credential_id, wrapped_k, prf_salt, updated_at FROM passkey_wraps"
        " WHERE account_id = $1 AND vault_id = $2 ORDER BY created_at, credential_id",
        account_id,
        vault_id,
    )
    return [PasskeyWrapRow(**dict(r)) for r in rows]


async def delete(conn: Conn, account_id: str, vault_id: str, credential_id: str) -> bool:
    """Forget one passkey wrap; False when there was none."""
    status: str = await conn.execute(
        "DELETE FROM passkey_wraps WHERE account_id = $1 AND vault_id = $2 AND credential_id = $3",
        account_id,
        vault_id,
        credential_id,
    )
    return status.split()[-1] != "0"
