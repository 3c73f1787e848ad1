"""Passkey wraps of passphrase vaults in the database (docs/web-vault.md "Passkey unlock", our
addition to PROTOCOL §13): opaque K-wraps and public PRF salts per vault and WebAuthn
credential id, stored under a vault key's auth (no account). The relay cannot open them: the
wrap key comes from the passkey's PRF output, which only the browser sees."""

from __future__ import annotations

from datetime import datetime
from typing import Final

import asyncpg

from engram_sync.relay.store.passkey_wraps import Conn, PasskeyWrapRow

#: Passkeys one vault may hold (a bound on rows a key can add); the account routes' cap.
MAX_PASSKEYS_PER_VAULT: Final = 10


class TooManyPasskeysError(Exception):
    """The vault holds MAX_PASSKEYS_PER_VAULT passkeys already."""


async def put(
    pool: asyncpg.Pool, vault_id: str, credential_id: str, wrapped_k: str, prf_salt: str
) -> datetime:
    """Store or replace a passkey wrap; TooManyPasskeysError past the cap (a replacement counts
    once). The count and the write share a transaction under the vault's advisory lock (a
    vault nobody pushed to has no `vaults` row to lock)."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('engram-vault-passkeys:' || $1, 0))",
            vault_id,
        )
        others: int = await conn.fetchval(
            "SELECT count(*) FROM vault_passkey_wraps WHERE vault_id = $1 AND credential_id <> $2",
            vault_id,
            credential_id,
        )
        if others >= MAX_PASSKEYS_PER_VAULT:
            raise TooManyPasskeysError
        updated: datetime = await conn.fetchval(
            "INSERT INTO vault_passkey_wraps (vault_id, credential_id, wrapped_k, prf_salt)"
            " VALUES ($1, $2, $3, $4) ON CONFLICT (vault_id, credential_id)"
            " DO UPDATE SET wrapped_k = $3, prf_salt = $4, updated_at = now()"
            " RETURNING updated_at",
            vault_id,
            credential_id,
            wrapped_k,
            prf_salt,
        )
        return updated


async def get(conn: Conn, vault_id: str, credential_id: str) -> PasskeyWrapRow | None:
    """One passkey wrap of the vault, if stored."""
    row = await conn.fetchrow(
        "SELECT credential_id, wrapped_k, prf_salt, updated_at FROM vault_passkey_wraps"
        " WHERE vault_id = $1 AND credential_id = $2",
        vault_id,
        credential_id,
    )
    return None if row is None else PasskeyWrapRow(**dict(row))


async def listed(conn: Conn, vault_id: str) -> list[PasskeyWrapRow]:
    """The vault's passkey wraps, oldest first."""
    rows = await conn.fetch(
        "SELECT credential_id, wrapped_k, prf_salt, updated_at FROM vault_passkey_wraps"
        " WHERE vault_id = $1 ORDER BY created_at, credential_id",
        vault_id,
    )
    return [PasskeyWrapRow(**dict(r)) for r in rows]


async def delete(conn: Conn, vault_id: str, credential_id: str) -> bool:
    """Forget one passkey wrap; False when there was none."""
    status: str = await conn.execute(
        "DELETE FROM vault_passkey_wraps WHERE vault_id = $1 AND credential_id = $2",
        vault_id,
        credential_id,
    )
    return status.split()[-1] != "0"
