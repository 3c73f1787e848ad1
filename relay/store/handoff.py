"""The team key handoff mailbox in the database (PROTOCOL §14).

The relay keeps the requester's public key, then one seal (the admin's
ephemeral public key and ciphertext of K it cannot open). A request made with a
pairing code also keeps the requester's SPAKE2 message and the code's public id,
and its seal the admin's SPAKE2 message and `seal_auth` (PROTOCOL §14 step 4):
public values the relay relays but cannot use. Claiming is one
statement: it returns the seal and erases it in the same UPDATE, so concurrent
claims have exactly one winner. At expiry the seal is erased; the row (public
metadata only) stays a day so the status route can say "expired", then goes.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, TypeAlias

import asyncpg

from engram_sync.relay.store.transactions import Database, transaction

HANDOFF_TTL: Final = timedelta(minutes=15)
EXPIRED_ROW_GRACE: Final = timedelta(days=1)
# PROTOCOL §14: open requests are limited per requesting key, not per vault, so one
# member cannot block the queue; the per-vault bound is only a safety net that keeps
# the mailbox's storage bounded, far above what any team's onboarding needs.
MAX_PENDING_PER_KEY: Final = 5
MAX_PENDING_PER_VAULT: Final = 1000

Conn: TypeAlias = asyncpg.Connection | asyncpg.Pool

_STATUS: Final = """
    CASE WHEN claimed_at IS NOT NULL THEN 'claimed'
         WHEN expires_at <= now() THEN 'expired'
         WHEN sealed_at IS NOT NULL THEN 'sealed'
         ELSE 'pending' END
"""


class TooManyRequestsError(Exception):
    """A limit on open requests is reached: the requesting key's, or the vault's."""

    def __init__(self, scope: str, limit: int) -> None:
        super().__init__(f"{limit} open handoff requests for this {scope}")
        self.scope = scope  # "key" or "vault"
        self.limit = limit


@dataclass(frozen=True)
class HandoffRow:
    """A request as stored (public data only; the seal is never read back but by claim)."""

    request_id: str
    vault_id: str
    public_key: str
    label: str
    requester_key_id: str
    created_at: datetime
    expires_at: datetime
    sealed_at: datetime | None
    claimed_at: datetime | None
    status: str
    pake: str | None = None  # the requester's SPAKE2 message (pairing-code path)
    pairing_id: str | None = None


@dataclass(frozen=True)
class ClaimedSeal:
    """What a successful claim hands the requester."""

    admin_public_key: str
    sealed: str
    admin_pake: str | None = None
    auth: str | None = None


def new_request_id() -> str:
    """A public id for a handoff request."""
    return "ho_" + secrets.token_hex(12)


# Constant SQL fragments only (the `noqa: S608` below): every value is a $n parameter.
_COLUMNS: Final = (
    "request_id, vault_id, public_key, label, requester_key_id, created_at, expires_at,"
    f" sealed_at, claimed_at, {_STATUS} AS status, requester_pake AS pake, pairing_id"
)
# A request just inserted is pending (its ttl is positive). Citus refuses now() in
# RETURNING, so the insert names the status instead of computing it (deploy/SCALING.md §3).
_NEW_COLUMNS: Final = _COLUMNS.replace(f"{_STATUS} AS status", "'pending' AS status")


def _row(record: asyncpg.Record) -> HandoffRow:
    return HandoffRow(**dict(record))


async def create(
    db: Database,
    vault_id: str,
    public_key: str,
    label: str,
    requester_key_id: str,
    ttl: timedelta = HANDOFF_TTL,
    *,
    pake: str | None = None,
    pairing_id: str | None = None,
) -> HandoffRow:
    """Open a request; TooManyRequestsError when the requesting key already has
    MAX_PENDING_PER_KEY open (unclaimed, unexpired) ones, or the vault MAX_PENDING_PER_VAULT."""
    async with transaction(db) as conn:
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('engram-handoff:' || $1, 0))", vault_id
        )
        await purge_expired_requests(conn, vault_id)
        counts = await conn.fetchrow(
            "SELECT count(*) AS vault, count(*) FILTER (WHERE requester_key_id = $2) AS key"
            " FROM handoff_requests WHERE vault_id = $1 AND claimed_at IS NULL"
            " AND expires_at > now()",
            vault_id,
            requester_key_id,
        )
        if counts["key"] >= MAX_PENDING_PER_KEY:
            raise TooManyRequestsError("key", MAX_PENDING_PER_KEY)
        if counts["vault"] >= MAX_PENDING_PER_VAULT:
            raise TooManyRequestsError("vault", MAX_PENDING_PER_VAULT)
        record = await conn.fetchrow(
            "INSERT INTO handoff_requests (vault_id, request_id, public_key, label,"  # noqa: S608
            " requester_key_id, expires_at, requester_pake, pairing_id)"
            " VALUES ($1, $2, $3, $4, $5, now() + $6, $7, $8)"
            f" RETURNING {_NEW_COLUMNS}",
            vault_id,
            new_request_id(),
            public_key,
            label,
            requester_key_id,
            ttl,
            pake,
            pairing_id,
        )
    return _row(record)


async def pending(pool: asyncpg.Pool, vault_id: str) -> list[HandoffRow]:
    """Unsealed, unclaimed, unexpired requests of the vault, oldest first."""
    async with pool.acquire() as conn:
        await purge_expired_requests(conn, vault_id)
        rows = await conn.fetch(
            f"SELECT {_COLUMNS} FROM handoff_requests WHERE vault_id = $1"  # noqa: S608
            " AND sealed_at IS NULL"
            " AND claimed_at IS NULL AND expires_at > now() ORDER BY created_at, request_id",
            vault_id,
        )
    return [_row(r) for r in rows]


async def get(pool: asyncpg.Pool, vault_id: str, request_id: str) -> HandoffRow | None:
    """One request with its status, if it exists (expired ones for a day)."""
    async with pool.acquire() as conn:
        await purge_expired_requests(conn, vault_id)
        record = await conn.fetchrow(
            f"SELECT {_COLUMNS} FROM handoff_requests"  # noqa: S608
            " WHERE vault_id = $1 AND request_id = $2",
            vault_id,
            request_id,
        )
    return None if record is None else _row(record)


async def seal(
    pool: asyncpg.Pool,
    vault_id: str,
    request_id: str,
    admin_public_key: str,
    sealed: str,
    *,
    admin_pake: str | None = None,
    auth: str | None = None,
) -> datetime | None:
    """Store the seal of a pending request; None when it is not pending (see `get`) or
    when it carries a SPAKE2 message and auth exactly when the request did not."""
    async with pool.acquire() as conn:
        await purge_expired_requests(conn, vault_id)
        sealed_at: datetime | None = await conn.fetchval(
            "UPDATE handoff_requests SET admin_public_key = $3, sealed = $4, sealed_at = now(),"
            " admin_pake = $5, seal_auth = $6"
            " WHERE vault_id = $1 AND request_id = $2 AND sealed_at IS NULL"
            " AND claimed_at IS NULL AND expires_at > now()"
            " AND (requester_pake IS NULL) = ($5::text IS NULL) RETURNING sealed_at",
            vault_id,
            request_id,
            admin_public_key,
            sealed,
            admin_pake,
            auth,
        )
    return sealed_at


async def claim(
    pool: asyncpg.Pool, vault_id: str, request_id: str, requester_key_id: str
) -> ClaimedSeal | None:
    """Hand the seal over and erase it, exactly once; None for everyone else (see `get`)."""
    async with pool.acquire() as conn:
        await purge_expired_requests(conn, vault_id)
        async with conn.transaction():
            # Lock the row and read the seal before the UPDATE erases it; a concurrent
            # claimer waits on that lock, then re-checks `claimed_at IS NULL` against
            # the winner's committed row and updates nothing. Two statements: Citus
            # refuses FOR UPDATE inside a CTE (deploy/SCALING.md §3).
            record = await conn.fetchrow(
                "SELECT admin_public_key, sealed, admin_pake, seal_auth FROM handoff_requests"
                " WHERE vault_id = $1 AND request_id = $2 FOR UPDATE",
                vault_id,
                request_id,
            )
            status = await conn.execute(
                """
                UPDATE handoff_requests
                SET claimed_at = now(), sealed = NULL, admin_public_key = NULL,
                    admin_pake = NULL, seal_auth = NULL
                WHERE vault_id = $1 AND request_id = $2
                  AND requester_key_id = $3 AND claimed_at IS NULL
                  AND sealed IS NOT NULL AND expires_at > now()
                """,
                vault_id,
                request_id,
                requester_key_id,
            )
            if status != "UPDATE 1":
                return None
    if record is None or record["sealed"] is None:
        return None
    return ClaimedSeal(
        record["admin_public_key"], record["sealed"], record["admin_pake"], record["seal_auth"]
    )


async def cancel(pool: asyncpg.Pool, vault_id: str, request_id: str) -> bool:
    """Delete a request and anything sealed to it; False when there was none."""
    status: str = await pool.execute(
        "DELETE FROM handoff_requests WHERE vault_id = $1 AND request_id = $2",
        vault_id,
        request_id,
    )
    return status.split()[-1] != "0"


async def purge_expired_requests(conn: Conn, vault_id: str | None = None) -> int:
    """Erase the seals of expired requests and delete rows a day past expiry.

    `vault_id` limits the sweep to one vault (what the routes do); None sweeps all.
    Returns the number of rows touched.
    """
    scope, args = ("", ()) if vault_id is None else (" AND vault_id = $1", (vault_id,))
    erased: str = await conn.execute(
        "UPDATE handoff_requests SET sealed = NULL, admin_public_key = NULL,"  # noqa: S608
        " admin_pake = NULL, seal_auth = NULL"
        f" WHERE expires_at <= now() AND sealed IS NOT NULL{scope}",
        *args,
    )
    grace = len(args) + 1
    deleted: str = await conn.execute(
        f"DELETE FROM handoff_requests WHERE expires_at <= now() - ${grace}::interval{scope}",  # noqa: S608
        *args,
        EXPIRED_ROW_GRACE,
    )
    return int(erased.split()[-1]) + int(deleted.split()[-1])
