"""Pulls and stats on PostgreSQL (PROTOCOL §5, §7, §9); pushes are `relay.store.push`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg
from msgspec import UNSET

from relay.errors import RelayError
from shared_format.wire import SyncBlob

# The cursor pull's keyset query on the (vault_id, seq) index. Public: the benchmark's
# raw-database ceiling runs this very statement (bench/ceiling.py).
PULL_PAGE = (
    "SELECT vault_id, memory_id, device_id, vector_clock, ciphertext, hmac, created_at,"
    " deleted, seq FROM blobs WHERE vault_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
)


def _to_blob(row: asyncpg.Record, *, with_seq: bool = False) -> SyncBlob:
    """The eight fields of §3; a cursor-mode blob adds its additive `seq` (§9)."""
    return SyncBlob(
        vault_id=row["vault_id"],
        memory_id=row["memory_id"],
        device_id=row["device_id"],
        vector_clock=row["vector_clock"],
        ciphertext=row["ciphertext"],
        hmac=row["hmac"],
        created_at=row["created_at"],
        deleted=row["deleted"],
        seq=row["seq"] if with_seq else UNSET,
    )


@dataclass(frozen=True)
class Page:
    """One page of a pull."""

    blobs: list[SyncBlob]
    has_more: bool
    cursor: int
    head: int = 0  # the vault's sequence (PROTOCOL §17: a restored relay's is lower)
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
        rows = await conn.fetch(PULL_PAGE, vault_id, cursor, limit + 1)
        # The vault row was read before the page: a push committing in between can put
        # blobs above it on the page, and the head must never be below a seq sent. Never
        # raised to the request's cursor, though: a head below it is how a device sees
        # a restored relay (PROTOCOL §17).
        head = 0 if vault is None else int(vault["seq"])
        if rows:
            head = max(head, int(rows[-1]["seq"]))
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
        lag = max(0, head - new_cursor)
        return Page([_to_blob(r, with_seq=True) for r in rows], has_more, new_cursor, head, lag)


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
            SELECT coalesce((SELECT live_blobs FROM vaults WHERE vault_id = $1), 0) AS live,
                   (SELECT created_at FROM blobs WHERE vault_id = $1
                    ORDER BY created_at_ts DESC, seq DESC LIMIT 1) AS latest
            """,
            vault_id,
        )
    return int(row["live"]), row["latest"]
