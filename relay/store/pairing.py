"""Pairing codes in the database: stored only as SHA-256, redeemed at most once.

A code is created by an admin of the vault (key or owning account), lives 10
minutes, and at most 5 live codes exist per vault. Redeeming it is one
transaction: a single `UPDATE … WHERE redeemed_at IS NULL AND expires_at > now()`
decides the one winner, which gets a fresh non-admin key (bound to its device
unless the code says otherwise) and a roster entry with its label.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import asyncpg

from engram_sync.relay.store.accounts import device_revoked, insert_key
from engram_sync.relay.store.transactions import Database, transaction
from engram_sync.shared_format.pairing import new_pairing_code, pairing_code_hash

PAIRING_TTL: Final = timedelta(minutes=10)
MAX_LIVE_CODES: Final = 5
ACCOUNT_CREATOR: Final = "account:"
KEY_CREATOR: Final = "key:"


class TooManyCodesError(Exception):
    """The vault already has the maximum number of live codes."""


class DeviceRevokedError(Exception):
    """The redeeming device was revoked in the code's vault (the code stays unused)."""


@dataclass(frozen=True)
class IssuedCode:
    """A new code (the text is shown once) and its expiry."""

    code: str
    expires_at: datetime


@dataclass(frozen=True)
class Redemption:
    """The key a redeemed code produced (the key text is shown once)."""

    vault_id: str
    key_id: str
    api_key: str
    device_bound: bool
    label: str


async def create_code(
    db: Database,
    vault_id: str,
    *,
    label: str | None,
    device_bound: bool,
    created_by: str,
    ttl: timedelta = PAIRING_TTL,
) -> IssuedCode:
    """Issue a code for the vault; TooManyCodesError past MAX_LIVE_CODES live ones."""
    code = new_pairing_code()
    async with transaction(db) as conn:
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('engram-pairing:' || $1, 0))", vault_id
        )
        await conn.execute(
            "DELETE FROM pairing_codes WHERE vault_id = $1 AND expires_at <= now()", vault_id
        )
        live: int = await conn.fetchval(
            "SELECT count(*) FROM pairing_codes WHERE vault_id = $1 AND redeemed_at IS NULL",
            vault_id,
        )
        if live >= MAX_LIVE_CODES:
            raise TooManyCodesError(vault_id)
        expires_at: datetime = await conn.fetchval(
            "INSERT INTO pairing_codes (code_hash, vault_id, label, device_bound, created_by,"
            " expires_at) VALUES ($1, $2, $3, $4, $5, now() + $6) RETURNING expires_at",
            pairing_code_hash(code),
            vault_id,
            label,
            device_bound,
            created_by,
            ttl,
        )
    return IssuedCode(code, expires_at)


async def redeem(db: Database, code: str, device_id: str, label: str | None) -> Redemption | None:
    """Redeem a code once; None when unknown, used or expired (an expired code is erased)."""
    code_hash = pairing_code_hash(code)
    async with transaction(db) as conn:
        # An expired code's row goes now, whoever asks (and `gc` sweeps the rest).
        await conn.execute(
            "DELETE FROM pairing_codes WHERE code_hash = $1 AND expires_at <= now()", code_hash
        )
        row = await conn.fetchrow(
            "UPDATE pairing_codes SET redeemed_at = now(), redeemed_device_id = $2"
            " WHERE code_hash = $1 AND redeemed_at IS NULL AND expires_at > now()"
            " RETURNING vault_id, label, device_bound, created_by",
            code_hash,
            device_id,
        )
        if row is None:
            return None
        vault_id: str = row["vault_id"]
        if await device_revoked(conn, vault_id, device_id):
            raise DeviceRevokedError(device_id)  # rolls back: the code stays unused
        device_label = label or row["label"] or "paired device"
        creator: str = row["created_by"]
        account_id = (
            creator.removeprefix(ACCOUNT_CREATOR) if creator.startswith(ACCOUNT_CREATOR) else None
        )
        if creator.startswith(KEY_CREATOR):  # PROTOCOL §13: the key's account, if any, so
            # that removing that account's grant revokes the keys its codes minted too
            account_id = await conn.fetchval(
                "SELECT account_id FROM api_keys WHERE id = $1", creator.removeprefix(KEY_CREATOR)
            )
        key_id, key = await insert_key(
            conn,
            vault_id=vault_id,
            is_admin=False,
            device_id=device_id if row["device_bound"] else None,
            account_id=account_id,
            label=f"paired: {device_label}"[:128],
        )
        await conn.execute(
            "INSERT INTO devices (vault_id, device_id, label) VALUES ($1, $2, $3)"
            " ON CONFLICT (vault_id, device_id)"
            " DO UPDATE SET label = $3, last_seen = EXCLUDED.last_seen",
            vault_id,
            device_id,
            device_label,
        )
    return Redemption(vault_id, key_id, key, row["device_bound"], device_label)


async def purge_expired_codes(conn: asyncpg.Connection | asyncpg.Pool) -> int:
    """Delete every expired code (used or not); returns how many."""
    status: str = await conn.execute("DELETE FROM pairing_codes WHERE expires_at <= now()")
    return int(status.split()[-1])
