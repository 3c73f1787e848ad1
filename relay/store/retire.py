"""Vault retirement on PostgreSQL (PROTOCOL §19, docs/rekey.md "Relay").

`retire` marks a vault retired under its row lock, the lock every push takes
(relay.store.push reads the retirement in its locking statement), so a push either
commits before the retire commits or is refused 410 `vault_retired`: no push commits
after it. `retirement` reads the state for the routes that refuse a retired vault
(minting keys, handoff requests, pairing codes) or, after the grace period, answer
410 on every route. `erase_expired` is the maintenance round's part: the blobs,
device progress and open handoffs of every vault past its `erase_after` go; the vault
row stays as a tombstone of the retirement, so its routes keep answering 410 with the
successor.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeAlias

import asyncpg

from engram_sync.relay.domain.domain_errors import AlreadyRetiredError, VaultRetiredError
from engram_sync.relay.store.feed_notify import announce_revocation

Conn: TypeAlias = asyncpg.Connection | asyncpg.Pool


@dataclass(frozen=True)
class Retirement:
    """A retired vault: where its devices should go, and when its blobs are erased."""

    vault_id: str
    successor: str | None
    retired_at: datetime
    erase_after: datetime
    erased: bool  # erase_after has passed: every route of the vault answers 410
    # PROTOCOL §19: the successor statement the retire stored (opaque text; None: none)
    statement: str | None = None
    stated_at: str | None = None

    def refusal(self) -> VaultRetiredError:
        """The 410 `vault_retired` of this vault (answered by relay.http.errors)."""
        return VaultRetiredError(self.vault_id, self.successor, self.statement, self.stated_at)


@dataclass(frozen=True)
class Statement:
    """PROTOCOL §19: the successor statement a retire carries (checked for shape by the
    route, never for validity: the relay does not hold the key)."""

    statement: str
    stated_at: str


_STATED = "successor_statement, successor_stated_at"
_COLUMNS = (
    f"vault_id, successor, retired_at, erase_after, erase_after <= now() AS erased, {_STATED}"
)

# The first retire of a vault nobody pushed to makes its row (and claims it for the
# operator, as a first push does: an account's keys exist only for vaults it owns),
# committed on its own like a first push (relay.store.push), then locks it.
_ENSURE_ROW = (
    "WITH claim AS (INSERT INTO vault_owners (vault_id, owner) VALUES ($1, 'operator')"
    " ON CONFLICT DO NOTHING)"
    " INSERT INTO vaults (vault_id) VALUES ($1) ON CONFLICT DO NOTHING"
)
_LOCK = f"SELECT {_COLUMNS} FROM vaults WHERE vault_id = $1 AND retired_at IS NOT NULL"  # noqa: S608
# No now() in RETURNING (Citus refuses it, deploy/SCALING.md §3): just retired, the vault
# is erased already only with a grace of 0, i.e. when erase_after is retired_at.
_RETIRE = f"""
    UPDATE vaults SET retired_at = now(), successor = $2, erase_after = now() + $3::interval,
        successor_statement = $4, successor_stated_at = $5
    WHERE vault_id = $1 AND retired_at IS NULL
    RETURNING vault_id, successor, retired_at, erase_after, erase_after <= retired_at AS erased,
        {_STATED}
"""  # noqa: S608 - constants
# A repeated retire with the same successor brings the statement a first one lacked (e.g.
# an operator's `engram-relay vaults retire`, then the re-keying device's own): the first
# statement stored stays, never replaced.
_STATE = f"""
    UPDATE vaults SET successor_statement = $2, successor_stated_at = $3
    WHERE vault_id = $1 AND successor_statement IS NULL
    RETURNING vault_id, successor, retired_at, erase_after, erase_after <= now() AS erased,
        {_STATED}
"""  # noqa: S608 - constants


def _of(row: asyncpg.Record) -> Retirement:
    return Retirement(
        row["vault_id"],
        row["successor"],
        row["retired_at"],
        row["erase_after"],
        row["erased"],
        row["successor_statement"],
        row["successor_stated_at"],
    )


async def retire(
    pool: asyncpg.Pool,
    vault_id: str,
    successor: str | None,
    grace: timedelta,
    stated: Statement | None = None,
) -> Retirement:
    """Retire the vault (idempotent); `AlreadyRetiredError` when it was retired with
    another successor. `stated` (PROTOCOL §19) is stored with it; a repeat with the same
    successor stores it only when none was (the first statement stands).

    The UPDATE waits for the vault's row lock like a push does, and a push waiting for
    it after this commits reads the retirement (READ COMMITTED re-reads a row locked
    FOR UPDATE once its lock is released), so pushes and the retire are serialised.
    """
    async with pool.acquire() as conn:
        return await retire_on(conn, vault_id, successor, grace, stated)


async def retire_on(
    conn: asyncpg.Connection,
    vault_id: str,
    successor: str | None,
    grace: timedelta,
    stated: Statement | None = None,
) -> Retirement:
    """`retire` on one connection outside a transaction (the route's pooled one, or
    `engram-relay vaults retire`'s own)."""
    await conn.execute(_ENSURE_ROW, vault_id)
    async with conn.transaction():
        said = (stated.statement, stated.stated_at) if stated is not None else (None, None)
        row = await conn.fetchrow(_RETIRE, vault_id, successor, grace, *said)
        if row is not None:  # unused pairing codes would mint keys for it: gone
            await conn.execute("DELETE FROM pairing_codes WHERE vault_id = $1", vault_id)
        else:  # retired before: same answer for the same call, else 409
            row = await conn.fetchrow(_LOCK + " FOR UPDATE", vault_id)
            assert row is not None  # the row exists and retirements are never undone
            if row["successor"] != successor:
                raise AlreadyRetiredError(vault_id, row["successor"])
            if stated is not None and row["successor_statement"] is None:
                row = await conn.fetchrow(_STATE, vault_id, *said) or row
    # PROTOCOL §19, after the commit: every relay process wakes the vault's open event
    # streams to re-check (as after a revocation); they send `event: retired` and end
    await announce_revocation(conn, vault_id)
    return _of(row)


async def retirement(conn: Conn, vault_id: str) -> Retirement | None:
    """The vault's retirement, None while it is live (or nobody used it)."""
    row = await conn.fetchrow(_LOCK, vault_id)
    return None if row is None else _of(row)


async def refuse_if_retired(conn: Conn, vault_id: str) -> None:
    """`VaultRetiredError` when the vault is retired: for the routes that give a retired
    vault nothing new (keys, handoff requests, pairing codes; PROTOCOL §19)."""
    found = await retirement(conn, vault_id)
    if found is not None:
        raise found.refusal()


async def refuse_if_erased(conn: Conn, vault_id: str) -> None:
    """`VaultRetiredError` once the vault's grace period is over (every route, §19)."""
    found = await retirement(conn, vault_id)
    if found is not None and found.erased:
        raise found.refusal()


# Each vault in its own transaction, under its row lock (serialised with pushes, which
# are refused anyway, and with compaction). The counts, the digest and the bucket
# prefixes and counts go to zero with the blobs (PROTOCOL §18: the digest covers the rows
# held). Revoked devices' rows stay: their keys keep getting `device_revoked`; other
# devices' rows (their progress) go.
_EXPIRED = (
    "SELECT vault_id FROM vaults WHERE retired_at IS NOT NULL AND erase_after <= now()"
    " AND (live_blobs + tombstones > 0 OR bytes_used > 0"
    " OR EXISTS (SELECT 1 FROM devices d WHERE d.vault_id = vaults.vault_id"
    " AND d.revoked_at IS NULL)) ORDER BY erase_after, vault_id"
)
_ERASE = [
    # Re-checked under the lock: an undo (relay.store.retire_undo) may have committed since
    # _EXPIRED read the vault, and then nothing is erased.
    "SELECT 1 FROM vaults WHERE vault_id = $1 AND retired_at IS NOT NULL"
    " AND erase_after <= now() FOR UPDATE",
    "DELETE FROM blobs WHERE vault_id = $1",
    "DELETE FROM devices WHERE vault_id = $1 AND revoked_at IS NULL",
    "DELETE FROM handoff_requests WHERE vault_id = $1",
    "DELETE FROM pairing_codes WHERE vault_id = $1",
    "DELETE FROM vault_passkey_wraps WHERE vault_id = $1",  # K-wraps go with the vault
    "UPDATE vaults SET live_blobs = 0, tombstones = 0, bytes_used = 0,"
    " digest = decode(repeat('00', 32), 'hex'), bucket_prefixes = decode(repeat('00', 2048),"
    " 'hex'), bucket_counts = decode(repeat('00', 1024), 'hex') WHERE vault_id = $1",
]


async def erase_expired(conn: asyncpg.Connection) -> int:
    """Erase every retired vault whose grace period is over; how many were erased."""
    erased = 0
    for row in await conn.fetch(_EXPIRED):
        async with conn.transaction():
            if await conn.fetchval(_ERASE[0], row["vault_id"]) is None:
                continue  # undone meanwhile (relay.store.retire_undo)
            for statement in _ERASE[1:]:
                await conn.execute(statement, row["vault_id"])
            erased += 1
    return erased
