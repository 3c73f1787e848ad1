"""The device roster, registration and revocation (PROTOCOL §5, §10)."""

from __future__ import annotations

import asyncpg

from engram_sync.relay.store.feed_notify import announce_revocation
from engram_sync.shared_format.timestamps import format_rfc3339
from engram_sync.shared_format.wire import DeviceEntry


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


class LabelLockedError(Exception):
    """The device already has another label, and this key may not change it."""


class DeviceQuotaError(Exception):
    """A new device would take the vault past its device quota (PROTOCOL §5, 402)."""

    def __init__(self, limit: int, used: int) -> None:
        super().__init__(f"device quota of {limit} reached ({used} with this device)")
        self.detail = "devices"
        self.limit = limit
        self.used = used  # the projected count, as §5 asks


# Non-revoked devices that take a slot of the device quota at registration: those that
# hold blobs (what a push counts, relay/store/push.py) and those that carry a label, so
# registrations alone cannot grow the roster without bound either.
_SLOTS = """
    SELECT count(*) AS used, coalesce(bool_or(s.device_id = $2), false) AS mine FROM (
        SELECT device_id FROM devices
        WHERE vault_id = $1 AND label IS NOT NULL AND revoked_at IS NULL
        UNION
        SELECT DISTINCT b.device_id FROM blobs b WHERE b.vault_id = $1 AND NOT EXISTS
            (SELECT 1 FROM devices d WHERE d.vault_id = $1 AND d.device_id = b.device_id
             AND d.revoked_at IS NOT NULL)
    ) s
"""


async def register(
    pool: asyncpg.Pool,
    vault_id: str,
    device_id: str,
    label: str,
    *,
    may_relabel: bool,
    default_max_devices: int,
) -> None:
    """Create or label a device (a revoked device stays revoked).

    `may_relabel`: the key may replace a label the device already has (an admin key of
    the vault, or a key bound to this very device, PROTOCOL §10); other keys may set a
    first label or repeat the current one, else LabelLockedError. A device that takes no
    quota slot yet raises DeviceQuotaError when the vault's device quota (its `quotas`
    row, else `default_max_devices`; 0 = unlimited) is full.
    """
    async with pool.acquire() as conn, conn.transaction():
        # Registrations of one vault run one at a time, and under the vault row's lock
        # when it exists, so neither another registration nor a push (§6) can take the
        # last slot between the count and the write.
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('engram-devices:' || $1, 0))",
            vault_id,
        )
        await conn.execute("SELECT 1 FROM vaults WHERE vault_id = $1 FOR UPDATE", vault_id)
        current = await conn.fetchrow(
            "SELECT label, revoked_at IS NOT NULL AS revoked FROM devices"
            " WHERE vault_id = $1 AND device_id = $2",
            vault_id,
            device_id,
        )
        if current is not None and current["label"] not in (None, label) and not may_relabel:
            raise LabelLockedError(device_id)
        if current is None or not current["revoked"]:
            limit: int | None = await conn.fetchval(
                "SELECT max_devices FROM quotas WHERE vault_id = $1", vault_id
            )
            limit = default_max_devices if limit is None else limit
            if limit > 0:
                slots = await conn.fetchrow(_SLOTS, vault_id, device_id)
                if not slots["mine"] and slots["used"] + 1 > limit:
                    raise DeviceQuotaError(limit, slots["used"] + 1)
        await conn.execute(
            """
            INSERT INTO devices (vault_id, device_id, label) VALUES ($1, $2, $3)
            ON CONFLICT (vault_id, device_id)
            DO UPDATE SET label = $3, last_seen = EXCLUDED.last_seen
            """,
            vault_id,
            device_id,
            label,
        )


async def revoke(pool: asyncpg.Pool, vault_id: str, device_id: str) -> int:
    """Revoke a device and every key bound to it (idempotent); returns keys revoked now."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            revoked = await _revoke(conn, vault_id, device_id)
        await announce_revocation(conn, vault_id)  # PROTOCOL §15: after the commit
    return revoked


async def _revoke(conn: asyncpg.Connection, vault_id: str, device_id: str) -> int:
    await conn.execute(
        """
        INSERT INTO devices (vault_id, device_id, revoked_at) VALUES ($1, $2, now())
        ON CONFLICT (vault_id, device_id)
        DO UPDATE SET revoked_at = coalesce(devices.revoked_at, EXCLUDED.revoked_at)
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
