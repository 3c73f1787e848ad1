"""The live change feed's SQL (PROTOCOL §15): NOTIFY after commit, heads, re-checks.

`CHANGES` carries '<vault_id> <seq>' once per vault per commit, sent after the data
transaction committed (never inside it). `REVOCATIONS` (our addition, docs/live-feed.md)
carries '<vault_id>' after a device of that vault was revoked, so streams of the vault
end without any query while they are idle.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Final

import asyncpg

log = logging.getLogger(__name__)

CHANGES: Final = "engram_vault_changes"
REVOCATIONS: Final = "engram_vault_revocations"

_NOTIFY_CHANGES = (
    "SELECT pg_notify($1, v || ' ' || s) FROM unnest($2::text[], $3::bigint[]) AS u(v, s)"
)


async def announce(conn: asyncpg.Connection | asyncpg.Pool, heads: Mapping[str, int]) -> None:
    """One NOTIFY per vault, in one statement outside any transaction (PROTOCOL §15).

    A failure is logged, never raised: the push it follows has committed, and a device
    that misses the hint still gets the blobs at its next pull (the cursor is the truth)."""
    if not heads:
        return
    vaults = sorted(heads)
    try:
        await conn.execute(_NOTIFY_CHANGES, CHANGES, vaults, [heads[v] for v in vaults])
    except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError) as exc:
        log.warning(
            "change notification failed: %s",
            type(exc).__name__,
            extra={"vaults": len(vaults), "error": type(exc).__name__},
        )


async def announce_revocation(conn: asyncpg.Connection | asyncpg.Pool, vault_id: str) -> None:
    """Tell every relay process that a device of `vault_id` was revoked (after commit);
    a failure is logged: a revoked device's pulls are refused anyway (PROTOCOL §10)."""
    try:
        await conn.execute("SELECT pg_notify($1, $2)", REVOCATIONS, vault_id)
    except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError) as exc:
        log.warning("revocation notification failed: %s", type(exc).__name__)


async def vault_head(pool: asyncpg.Pool, vault_id: str) -> int:
    """The vault's sequence now (0 for a vault nobody pushed to)."""
    async with pool.acquire() as conn:
        seq = await conn.fetchval("SELECT seq FROM vaults WHERE vault_id = $1", vault_id)
    return int(seq or 0)


async def vault_heads(conn: asyncpg.Connection, vault_ids: Sequence[str]) -> dict[str, int]:
    """The sequences of several vaults in one query (those that exist)."""
    rows = await conn.fetch(
        "SELECT vault_id, seq FROM vaults WHERE vault_id = ANY($1::text[])", list(vault_ids)
    )
    return {r["vault_id"]: int(r["seq"]) for r in rows}


async def still_allowed(
    pool: asyncpg.Pool, vault_id: str, device_id: str | None, key_hash: bytes | None
) -> bool:
    """False once the stream's device was revoked in the vault (PROTOCOL §10, §15), or its
    minted key (`key_hash`) was; one query."""
    async with pool.acquire() as conn:
        revoked: bool = await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM devices WHERE vault_id = $1 AND device_id = $2"
            " AND revoked_at IS NOT NULL)"
            " OR EXISTS (SELECT 1 FROM api_keys WHERE key_hash = $3 AND revoked_at IS NOT NULL)",
            vault_id,
            device_id,
            key_hash,
        )
    return not revoked
