"""Push and pull on PostgreSQL (PROTOCOL §6, §7, §9).

A push is one transaction that takes the vault row's lock first, so pushes to
one vault are serialised: clock checks, quota projection and sequence numbers
never interleave, and sequence order equals commit order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from relay.errors import RelayError
from relay.push_rules import CheckedBlob, PushPlan, StoredVersion, plan_push
from shared_format.wire import SyncBlob


@dataclass(frozen=True)
class Quota:
    """Effective limits for one vault; 0 = unlimited."""

    max_devices: int
    max_bytes: int


@dataclass(frozen=True)
class PushOutcome:
    """What a committed push did."""

    plan: PushPlan
    cursor: int


def quota_exceeded(detail: str, limit: int, used: int) -> RelayError:
    """402 with the exact body of PROTOCOL §5."""
    return RelayError(
        402,
        "quota_exceeded",
        f"quota exceeded: {detail}",
        body={"error": {"code": "quota_exceeded", "detail": detail, "limit": limit, "used": used}},
    )


async def _check_quota(
    conn: asyncpg.Connection,
    vault_id: str,
    plan: PushPlan,
    stored: dict[str, StoredVersion],
    bytes_used: int,
    quota: Quota,
) -> int:
    """Project the vault's devices and bytes over the accepted set (PROTOCOL §6); new bytes."""
    new_bytes = bytes_used + sum(
        item.size_bytes - (stored[m].size_bytes if (m := item.blob.memory_id) in stored else 0)
        for item in plan.accepted
    )
    if quota.max_devices > 0:
        # Non-revoked devices holding blobs here. A device row alone (a label registration,
        # a pull with X-Engram-Device) takes no slot, else it would bypass the quota.
        active = await conn.fetch(
            "SELECT DISTINCT b.device_id FROM blobs b WHERE b.vault_id = $1 AND NOT EXISTS"
            " (SELECT 1 FROM devices d WHERE d.vault_id = $1 AND d.device_id = b.device_id"
            " AND d.revoked_at IS NOT NULL)",
            vault_id,
        )
        known = {r["device_id"] for r in active}
        devices = known | {i.blob.device_id for i in plan.accepted}
        # Only growth is refused: a vault already over a lowered limit keeps syncing.
        if len(devices) > quota.max_devices and len(devices) > len(known):
            raise quota_exceeded("devices", quota.max_devices, len(devices))
    if quota.max_bytes > 0 and new_bytes > max(quota.max_bytes, bytes_used):
        raise quota_exceeded("bytes", quota.max_bytes, new_bytes)
    return new_bytes


async def push(
    pool: asyncpg.Pool,
    vault_id: str,
    checked: list[CheckedBlob],
    *,
    bound_device: str | None,
    max_blob_bytes: int,
    default_quota: Quota,
) -> PushOutcome:
    """Run one push as one transaction under the vault lock; returns plan and new cursor."""
    memory_ids = list({c.blob.memory_id for c in checked})
    device_ids = list({c.blob.device_id for c in checked})
    async with pool.acquire() as conn, conn.transaction():
        vault = await _lock_vault(conn, vault_id)
        known = await conn.fetch(
            "SELECT true AS revoked, device_id AS id, 0::bigint AS clock, 0 AS size"
            " FROM devices WHERE vault_id = $1 AND device_id = ANY($2::text[])"
            " AND revoked_at IS NOT NULL"
            " UNION ALL SELECT false, memory_id, vector_clock, size_bytes FROM blobs"
            " WHERE vault_id = $1 AND memory_id = ANY($3::text[])",
            vault_id,
            device_ids,
            memory_ids,
        )
        stored = {r["id"]: StoredVersion(r["clock"], r["size"]) for r in known if not r["revoked"]}
        plan = plan_push(
            checked,
            vault_id=vault_id,
            bound_device=bound_device,
            max_blob_bytes=max_blob_bytes,
            revoked={r["id"] for r in known if r["revoked"]},
            stored=stored,
        )
        seq: int = vault["seq"]
        if not plan.accepted:
            return PushOutcome(plan=plan, cursor=seq)
        quota = Quota(
            default_quota.max_devices if vault["max_devices"] is None else vault["max_devices"],
            default_quota.max_bytes if vault["max_bytes"] is None else vault["max_bytes"],
        )
        new_bytes = await _check_quota(conn, vault_id, plan, stored, vault["bytes_used"], quota)
        new_seq = seq + len(plan.accepted)
        await _write_batch(conn, vault_id, plan.accepted, new_seq=new_seq, new_bytes=new_bytes)
        return PushOutcome(plan=plan, cursor=new_seq)


async def _lock_vault(conn: asyncpg.Connection, vault_id: str) -> asyncpg.Record:
    """The vault's row, locked for this transaction (PROTOCOL §6), created on first push;
    with its quota overrides. One round trip when the vault exists."""
    query = (
        "SELECT v.seq, v.bytes_used, q.max_devices, q.max_bytes FROM vaults v"
        " LEFT JOIN quotas q ON q.vault_id = v.vault_id WHERE v.vault_id = $1 FOR UPDATE OF v"
    )
    row: asyncpg.Record | None = await conn.fetchrow(query, vault_id)
    if row is None:
        await conn.execute(
            "INSERT INTO vaults (vault_id) VALUES ($1) ON CONFLICT DO NOTHING", vault_id
        )
        row = await conn.fetchrow(query, vault_id)
    assert row is not None
    return row


async def _write_batch(
    conn: asyncpg.Connection,
    vault_id: str,
    accepted: list[CheckedBlob],
    *,
    new_seq: int,
    new_bytes: int,
) -> None:
    """One statement for the whole batch: the set-based blob upsert (no per-blob round
    trips), the vault's new sequence and size, and the pushing devices' last_seen."""
    first_seq = new_seq - len(accepted) + 1
    columns: list[list[Any]] = [[] for _ in range(10)]
    for offset, item in enumerate(accepted):
        b = item.blob
        row = (
            b.memory_id,
            b.device_id,
            b.vector_clock,
            b.ciphertext,
            b.hmac,
            b.created_at,
            item.created_at_ts,
            b.deleted,
            first_seq + offset,
            item.size_bytes,
        )
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    await conn.execute(
        """
        WITH written AS (
            INSERT INTO blobs (vault_id, memory_id, device_id, vector_clock, ciphertext, hmac,
                               created_at, created_at_ts, deleted, seq, size_bytes)
            SELECT $1, * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::text[],
                                     $6::text[], $7::text[], $8::timestamptz[], $9::boolean[],
                                     $10::bigint[], $11::integer[])
            ON CONFLICT (vault_id, memory_id) DO UPDATE SET
                device_id = EXCLUDED.device_id, vector_clock = EXCLUDED.vector_clock,
                ciphertext = EXCLUDED.ciphertext, hmac = EXCLUDED.hmac,
                created_at = EXCLUDED.created_at, created_at_ts = EXCLUDED.created_at_ts,
                deleted = EXCLUDED.deleted, seq = EXCLUDED.seq,
                size_bytes = EXCLUDED.size_bytes, received_at = now()
        ), vault AS (
            UPDATE vaults SET seq = $12, bytes_used = $13 WHERE vault_id = $1
        )
        INSERT INTO devices (vault_id, device_id)
        SELECT $1, unnest($14::text[])
        ON CONFLICT (vault_id, device_id) DO UPDATE SET last_seen = now()
        """,
        vault_id,
        *columns,
        new_seq,
        new_bytes,
        sorted({item.blob.device_id for item in accepted}),
    )


def _to_blob(row: asyncpg.Record) -> SyncBlob:
    return SyncBlob(
        vault_id=row["vault_id"],
        memory_id=row["memory_id"],
        device_id=row["device_id"],
        vector_clock=row["vector_clock"],
        ciphertext=row["ciphertext"],
        hmac=row["hmac"],
        created_at=row["created_at"],
        deleted=row["deleted"],
    )


@dataclass(frozen=True)
class Page:
    """One page of a pull."""

    blobs: list[SyncBlob]
    has_more: bool
    cursor: int
    lag: int = 0  # blobs of the vault still ahead of `cursor` (for metrics)


def resync_required(cursor: int, horizon: int) -> RelayError:
    """409 for a device whose cursor is behind the compaction horizon (PROTOCOL §9, §12)."""
    return RelayError(
        409,
        "resync_required",
        f"cursor {cursor} is behind the compaction horizon {horizon}: "
        "pull again from cursor 0 and reconcile",
        extra={"horizon": horizon},
    )


async def pull_by_cursor(
    pool: asyncpg.Pool, vault_id: str, cursor: int, limit: int, device_id: str | None
) -> Page:
    """Blobs with seq > cursor in seq order (PROTOCOL §9); limit+1 rows decide has_more."""
    async with pool.acquire() as conn:
        vault = await conn.fetchrow(
            "SELECT seq, compacted_through FROM vaults WHERE vault_id = $1", vault_id
        )
        horizon = 0 if vault is None else int(vault["compacted_through"])
        if 0 < cursor < horizon:
            raise resync_required(cursor, horizon)
        rows = await conn.fetch(
            "SELECT vault_id, memory_id, device_id, vector_clock, ciphertext, hmac, created_at,"
            " deleted, seq FROM blobs WHERE vault_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            vault_id,
            cursor,
            limit + 1,
        )
        has_more = len(rows) > limit
        rows = rows[:limit]
        new_cursor = rows[-1]["seq"] if rows else cursor
        if device_id is not None:
            await conn.execute(
                """
                INSERT INTO devices (vault_id, device_id, pulled_cursor, pulled_at)
                VALUES ($1, $2, $3, now())
                ON CONFLICT (vault_id, device_id) DO UPDATE SET
                    pulled_cursor = GREATEST(devices.pulled_cursor, EXCLUDED.pulled_cursor),
                    pulled_at = now(), last_seen = now()
                """,
                vault_id,
                device_id,
                new_cursor,
            )
        lag = 0 if vault is None else max(0, int(vault["seq"]) - new_cursor)
        return Page([_to_blob(r) for r in rows], has_more, new_cursor, lag)


async def pull_since(
    pool: asyncpg.Pool, vault_id: str, since: datetime | None, limit: int
) -> tuple[list[SyncBlob], bool]:
    """Legacy pull (PROTOCOL §7): created_at >= since as instants, by (created_at, seq)."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT vault_id, memory_id, device_id, vector_clock, ciphertext, hmac, created_at,"
            " deleted FROM blobs WHERE vault_id = $1"
            " AND ($2::timestamptz IS NULL OR created_at_ts >= $2)"
            " ORDER BY created_at_ts, seq LIMIT $3",
            vault_id,
            since,
            limit + 1,
        )
    return [_to_blob(r) for r in rows[:limit]], len(rows) > limit


async def vault_stats(pool: asyncpg.Pool, vault_id: str) -> tuple[int, str | None]:
    """(live blobs, newest created_at text or None) for the stats route (PROTOCOL §5)."""
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            """
            SELECT (SELECT count(*) FROM blobs WHERE vault_id = $1 AND NOT deleted) AS live,
                   (SELECT created_at FROM blobs WHERE vault_id = $1
                    ORDER BY created_at_ts DESC, seq DESC LIMIT 1) AS latest
            """,
            vault_id,
        )
    return int(row["live"]), row["latest"]
