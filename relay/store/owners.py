"""Who owns a vault id, and which accounts were let in (PROTOCOL §13 "Vault ownership").

A vault id belongs to whoever first uses it: the operator (a static key at start-up,
`engram-relay keys create`, a first push) or one account (its first key or wrap).
The claim is `INSERT ... ON CONFLICT DO NOTHING` and a read back, in the transaction
of the key or wrap write that uses the vault, so of two racing claims exactly one
wins and the loser's write rolls back. The relay never moves ownership afterwards
(deleting a wrap does not free the id: a freed id could be squatted).
An account may mint keys and store wraps for a vault it owns or was granted
(`vault_grants`, written by an admin of the vault: docs/vault-ownership.md). A grant
carries a role, `member` or `admin` (revision 0016; relay.domain.grant_roles decides who may
do what); removing a grant revokes the keys the account minted for the vault.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Final, TypeAlias

import asyncpg

from engram_sync.relay.domain.grant_roles import ADMIN, MEMBER, Role, Standing, account_standing
from engram_sync.relay.store.feed_notify import announce_revocation

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
    role: Role = MEMBER


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


async def may_use(conn: Conn, account_id: str, vault_id: str) -> bool:
    """True when the account owns the vault or was granted it (no claim is made)."""
    found: bool = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM vault_owners WHERE vault_id = $1 AND account_id = $2)"
        " OR EXISTS (SELECT 1 FROM vault_grants WHERE vault_id = $1 AND account_id = $2)",
        vault_id,
        account_id,
    )
    return found


async def claim_for_account(conn: asyncpg.Connection, account_id: str, vault_id: str) -> Standing:
    """PROTOCOL §13: claim an unused id for the account, or check it owns or was granted
    it; VaultOwnedError otherwise. Call inside the transaction of the key or wrap write.
    The account's standing in the vault: `owner`, or its grant's role."""
    found = await claim(conn, vault_id, account_id)
    if found.account_id == account_id:
        return "owner"
    role = await grant_role(conn, vault_id, account_id)
    if role is None:
        raise VaultOwnedError(vault_id)
    return account_standing(found.account_id, account_id, role)


_GRANT_ROLE = "SELECT role FROM vault_grants WHERE vault_id = $1 AND account_id = $2"
_GRANT_ROLE_LOCKED = _GRANT_ROLE + " FOR UPDATE"


async def grant_role(
    conn: Conn, vault_id: str, account_id: str, *, lock: bool = False
) -> str | None:
    """The role of the account's grant of the vault, None without one. `lock`: hold the
    grant's row until the caller's transaction ends, so a role checked stays the role."""
    role: str | None = await conn.fetchval(
        _GRANT_ROLE_LOCKED if lock else _GRANT_ROLE,
        vault_id,
        account_id,
    )
    return role


async def standing(conn: Conn, vault_id: str, account_id: str) -> Standing:
    """The account's standing in the vault (relay.domain.grant_roles): owner, admin, member,
    none."""
    row = await conn.fetchrow(
        "SELECT (SELECT account_id FROM vault_owners WHERE vault_id = $1) AS owner,"
        " (SELECT role FROM vault_grants WHERE vault_id = $1 AND account_id = $2) AS role",
        vault_id,
        account_id,
    )
    return account_standing(row["owner"], account_id, row["role"])


async def grant(
    conn: asyncpg.Connection,
    vault_id: str,
    account_id: str,
    granted_by: str,
    role: Role = MEMBER,
    *,
    never_lower: bool = False,
) -> tuple[datetime, Role]:
    """Let the account into the vault with `role`; (the first grant's time, the role now).

    Idempotent; a repeat sets the role asked (the route checks first that the caller may),
    unless `never_lower` (adopting a vault with a key keeps an admin grant admin). Taking
    admin back makes the account's admin keys for the vault member keys (PROTOCOL §13)."""
    async with conn.transaction():
        before = await grant_role(conn, vault_id, account_id)
        row = await conn.fetchrow(
            "INSERT INTO vault_grants (vault_id, account_id, granted_by, role)"
            " VALUES ($1, $2, $3, $4) ON CONFLICT (vault_id, account_id) DO UPDATE SET role ="
            " CASE WHEN $5 AND vault_grants.role = 'admin' THEN 'admin' ELSE EXCLUDED.role END"
            " RETURNING granted_at, role",
            vault_id,
            account_id,
            granted_by,
            role,
            never_lower,
        )
        if before == "admin" and row["role"] == MEMBER:
            await _keys_of_grant(conn, vault_id, account_id, "is_admin = false")
    now: Role = ADMIN if row["role"] == ADMIN else MEMBER
    return row["granted_at"], now


async def _keys_of_grant(
    conn: asyncpg.Connection, vault_id: str, account_id: str, change: str
) -> int:
    """Apply `change` (a constant SET clause) to the keys the account minted for the vault,
    unless it owns the vault (an owner's own grant row, if any, never touches its keys)."""
    found = await owner(conn, vault_id)
    if found is not None and found.account_id == account_id:
        return 0
    status: str = await conn.execute(
        f"UPDATE api_keys SET {change} WHERE vault_id = $1 AND account_id = $2",  # noqa: S608
        vault_id,
        account_id,
    )
    return int(status.split()[-1])


async def revoke_grant(
    conn: asyncpg.Connection,
    vault_id: str,
    account_id: str,
    *,
    check: Callable[[str | None], None] | None = None,
) -> bool:
    """Remove a grant and revoke every key the account minted for the vault (PROTOCOL §13:
    removing a grant revokes the keys minted under it); False when there was none.

    `check` is called with the grant's role (None: no grant), read under the grant's row
    lock, and may raise to refuse (relay.domain.grant_roles.check_grant_removal). The keys' next
    request is refused (relay.http.auth reads `revoked_at` on every request) and their event
    streams end."""
    async with conn.transaction():
        if check is not None:
            check(await grant_role(conn, vault_id, account_id, lock=True))
        status: str = await conn.execute(
            "DELETE FROM vault_grants WHERE vault_id = $1 AND account_id = $2",
            vault_id,
            account_id,
        )
        removed = status.split()[-1] != "0"
        # least() skips NULL: a key's first revocation time stays (Citus: SCALING.md §3).
        revoked = await _keys_of_grant(
            conn, vault_id, account_id, "revoked_at = least(revoked_at, now())"
        )
    if revoked:
        await announce_revocation(conn, vault_id)  # PROTOCOL §15: after the commit
    return removed


async def grants(conn: Conn, vault_id: str) -> list[Grant]:
    """The vault's grants, oldest first, with each account's email and role."""
    rows = await conn.fetch(
        "SELECT g.vault_id, g.account_id, a.email, g.granted_by, g.granted_at, g.role"
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
