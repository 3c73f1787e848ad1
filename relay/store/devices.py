"""The device roster, registration and revocation (PROTOCOL §5, §10)."""

from __future__ import annotations

import asyncpg

from shared_format.timestamps import format_rfc3339
from shared_format.wire import DeviceEntry


async def roster(pool: asyncpg.Pool, vault_id: str) -> list[DeviceEntry]:
    """Every device that pushed, pulled or registered, newest first."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            """
            SELECT d.device_id, d.last_seen, d.label, d.revoked_at IS NOT NULL AS revoked,
                   coalesce(c.n, 0) AS blob_count
            FROM devices d
            LEFT JOIN (SELECT device_id, count(*) AS n FROM blobs WHERE vault_id = $1
                       GROUP BY device_id) c ON c.device_id = d.device_id
            WHERE d.vault_id = $1
            ORDER BY d.last_seen DESC, d.device_id
            """,
            vault_id,
        )
    return [
        DeviceEntry(
            device_id=r["device_id"],
            last_seen=format_rfc3339(r["last_seen"]),
            blob_count=int(r["blob_count"]),
            revoked=r["revoked"],
            label=r["label"],
        )
        for r in rows
    ]


async def register(pool: asyncpg.Pool, vault_id: str, device_id: str, label: str) -> None:
    """Create or relabel a device (a revoked device stays revoked)."""
    async with pool.acquire() as conn:
        await conn.execute(
            """
            INSERT INTO devices (vault_id, device_id, label) VALUES ($1, $2, $3)
            ON CONFLICT (vault_id, device_id) DO UPDATE SET label = $3, last_seen = now()
            """,
            vault_id,
            device_id,
            label,
        )


async def revoke(pool: asyncpg.Pool, vault_id: str, device_id: str) -> int:
    """Revoke a device and every key bound to it (idempotent); returns keys revoked now."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            """
            INSERT INTO devices (vault_id, device_id, revoked_at) VALUES ($1, $2, now())
            ON CONFLICT (vault_id, device_id)
            DO UPDATE SET revoked_at = coalesce(devices.revoked_at, now())
            """,
            vault_id,
            device_id,
        )
        status: str = await conn.execute(
            "UPDATE api_keys SET revoked_at = now()"
            " WHERE vault_id = $1 AND device_id = $2 AND revoked_at IS NULL",
            vault_id,
            device_id,
        )
    return int(status.split()[-1])
