"""Who owns a vault id, and which accounts were let in (PROTOCOL §13 "Vault ownership").

A vault id belongs to whoever first uses it: the operator (a static key at start-up,
`engram-relay keys create`, a first push) or one account (its first key or wrap).
The claim is `INSERT ... ON CONFLICT DO NOTHING` and a read back, in the transaction
of the key or wrap write that uses the vault, so of two racing claims exactly one
wins and the loser's write rolls back. The relay never moves ownership afterwards
(deleting a wrap does not free the id: a freed id could be squatted).
An account may mint keys and store wraps for a vault it owns or was granted
(`vault_grants`, written by an admin of the vault: docs/vault-ownership.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final, TypeAlias

import asyncpg

Conn: TypeAlias = asyncpg.Connection | asyncpg.Pool

OPERATOR: Final = "operator"
ACCOUNT: Final = "account"


class VaultOwnedError(Exception):
    """The vault id is taken by the operator or another account (403 `vault_owned`)."""

    def __init__(self, vault_id: str) -> None:
        super().__init__(vault_id)
        self.vault_id = vault_id


@dataclass(frozen=True)
class VaultOwner:
    """The owner of a vault id: the operator, or one account."""

    vault_id: str
    owner: str  # OPERATOR or ACCOUNT
    account_id: str | None
    claimed_at: datetime

    @property
    def is_operator(self) -> bool:
        """True when the operator owns the vault."""
        return self.owner == OPERATOR


@dataclass(frozen=True)
class Grant:
    """An account let into a vault by an admin of it."""

    vault_id: str
    account_id: str
    email: str
    granted_by: str
    granted_at: datetime


_OWNER = "SELECT vault_id, owner, account_id, claimed_at FROM vault_owners WHERE vault_id = $1"


async def owner(conn: Conn, vault_id: str) -> VaultOwner | None:
    """The vault's owner, None when nobody has used the id yet."""
    row = await conn.fetchrow(_OWNER, vault_id)
    return None if row is None else VaultOwner(**dict(row))


async def claim(conn: asyncpg.Connection, vault_id: str, account_id: str | None) -> VaultOwner:
    """Claim the id for `account_id` (None: the operator) unless taken; the owner after it.

    Run it in the transaction of the write that uses the vault: a concurrent claim of
    the same id waits on the primary key until this one commits or rolls back.
    """
    await conn.execute(
        "INSERT INTO vault_owners (vault_id, owner, account_id) VALUES ($1, $2, $3)"
        " ON CONFLICT (vault_id) DO NOTHING",
        vault_id,
        OPERATOR if account_id is None else ACCOUNT,
        account_id,
    )
    row = await conn.fetchrow(_OWNER, vault_id)
    assert row is not None  # inserted, or there before: owners are never deleted
    return VaultOwner(**dict(row))


async def claim_operator(conn: Conn, vault_ids: list[str]) -> None:
    """Claim every unclaimed id of `vault_ids` for the operator (one statement)."""
    await conn.execute(
        "INSERT INTO vault_owners (vault_id, owner) SELECT unnest($1::text[]), 'operator'"
        " ON CONFLICT (vault_id) DO NOTHING",
        vault_ids,
    )


async def is_granted(conn: Conn, vault_id: str, account_id: str) -> bool:
    """True when an admin of the vault granted the account."""
    found: bool = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM vault_grants WHERE vault_id = $1 AND account_id = $2)",
        vault_id,
        account_id,
    )
    return found


async def may_use(conn: Conn, account_id: str, vault_id: str) -> bool:
    """True when the account owns the vault or was granted it (no claim is made)."""
    found: bool = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM vault_owners WHERE vault_id = $1 AND account_id = $2)"
        " OR EXISTS (SELECT 1 FROM vault_grants WHERE vault_id = $1 AND account_id = $2)",
        vault_id,
        account_id,
    )
    return found


async def claim_for_account(conn: asyncpg.Connection, account_id: str, vault_id: str) -> None:
    """PROTOCOL §13: claim an unused id for the account, or check it owns or was granted
    it; VaultOwnedError otherwise. Call inside the transaction of the key or wrap write."""
    found = await claim(conn, vault_id, account_id)
    if found.account_id != account_id and not await is_granted(conn, vault_id, account_id):
        raise VaultOwnedError(vault_id)


async def grant(conn: Conn, vault_id: str, account_id: str, granted_by: str) -> datetime:
    """Let the account into the vault (idempotent: the first grant's time is kept)."""
    granted_at: datetime = await conn.fetchval(
        "INSERT INTO vault_grants (vault_id, account_id, granted_by) VALUES ($1, $2, $3)"
        " ON CONFLICT (vault_id, account_id) DO UPDATE SET vault_id = EXCLUDED.vault_id"
        " RETURNING granted_at",
        vault_id,
        account_id,
        granted_by,
    )
    return granted_at


async def revoke_grant(conn: Conn, vault_id: str, account_id: str) -> bool:
    """Remove a grant; False when there was none. Keys already minted stay valid."""
    status: str = await conn.execute(
        "DELETE FROM vault_grants WHERE vault_id = $1 AND account_id = $2", vault_id, account_id
    )
    return status.split()[-1] != "0"


async def grants(conn: Conn, vault_id: str) -> list[Grant]:
    """The vault's grants, oldest first, with each account's email."""
    rows = await conn.fetch(
        "SELECT g.vault_id, g.account_id, a.email, g.granted_by, g.granted_at"
        " FROM vault_grants g JOIN accounts a ON a.id = g.account_id"
        " WHERE g.vault_id = $1 ORDER BY g.granted_at, g.account_id",
        vault_id,
    )
    return [Grant(**dict(r)) for r in rows]


async def account_by_email_or_id(conn: Conn, who: str) -> tuple[str, str] | None:
    """(account id, email) of the account with this email (any case) or id, if any."""
    row = await conn.fetchrow(
        "SELECT id, email FROM accounts WHERE email = lower(btrim($1)) OR id = btrim($1)"
        " ORDER BY id = btrim($1) DESC LIMIT 1",
        who,
    )
    return None if row is None else (row["id"], row["email"])
