"""Pulls and stats on PostgreSQL (PROTOCOL §5, §7, §9); pushes are `relay.store.push`."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime

import asyncpg
from msgspec import UNSET

from engram_sync.relay.domain.domain_errors import ResyncRequiredError
from engram_sync.relay.store.begun import begun, hex_text
from engram_sync.relay.store.carried_digest import PULL_COLUMNS, CarriedDigest, carried_by_page
from engram_sync.relay.store.overlap import while_answered
from engram_sync.relay.store.retire import Retirement, retirement
from engram_sync.shared_format.wire import SyncBlob

# Both pull modes cap a page by count and by bytes (PROTOCOL §7, §9, §11; issue 14 item
# 5; `max_page_bytes` in /v1/info): of the limit+1 rows in keyset order ($3), rows go on
# the page while their ciphertext stays within the byte budget ($4; `size_bytes` is the
# ciphertext's length, so the sum detoasts nothing), and the first row always does. The
# first row off the page comes with a NULL ciphertext and only says `has_more`; rows after
# it are not sent.
# - Cursor mode (§9, every device of ours): a row is on the page while the ciphertext up
#   to and including it is within the budget, so a page never passes the budget, except a
#   page of one blob that alone is larger (an operator may set the budget below
#   ENGRAM_RELAY_MAX_BLOB_BYTES). Before issue 31 a page ended with the blob that crossed
#   the budget (9.4 MB pages for an 8.4 MB cap).
# - Legacy `since` mode (§7): a row is on the page while the ciphertext before it is below
#   the budget, and the first two rows always are, so a page may pass the budget by its
#   last blob. A `since` reader asks again from its last blob's instant and gets that blob
#   again, so a page must hold the blob after it too, whatever the sizes, or the reader
#   would never move on (before issue 31 a blob as large as the budget stopped it there).
# Either way the relay holds at most the budget plus two blobs, never 1000 large blobs.


def _byte_capped(rows: str, order: str, *, within: bool) -> str:
    """`rows` (keyset order `order`, limit+1) cut at the byte budget $4 as described above
    (`within`: the cursor mode's rule): the one window both pull modes share. Only
    constants of this module go in."""
    if within:
        on_page, kept = (
            "n = 1 OR before + size_bytes <= $4::bigint",
            "n <= 2 OR before <= $4::bigint",
        )
    else:
        on_page, kept = "n <= 2 OR before < $4::bigint", "n <= 3 OR before - previous < $4::bigint"
    return f"""
    SELECT vault_id, memory_id, device_id, vector_clock,
           CASE WHEN {on_page} THEN ciphertext END AS ciphertext, hmac, created_at, deleted, seq
    FROM (
        SELECT b.*, sum(size_bytes) OVER w - size_bytes AS before,
               lag(size_bytes, 1, 0) OVER w AS previous, row_number() OVER w AS n
        FROM ({rows}) b
        WINDOW w AS (ORDER BY {order} ROWS UNBOUNDED PRECEDING)
    ) capped
    WHERE {kept}
    """  # noqa: S608 - constants


_CURSOR_ROWS = (
    "SELECT vault_id, memory_id, device_id, vector_clock, ciphertext, hmac, created_at,"
    " deleted, seq, size_bytes"
    " FROM blobs WHERE vault_id = $1 AND seq > $2 ORDER BY seq LIMIT $3 + 1"
)
_SINCE_ROWS = (
    "SELECT vault_id, memory_id, device_id, vector_clock, ciphertext, hmac, created_at,"
    " deleted, seq, size_bytes, created_at_ts"
    " FROM blobs WHERE vault_id = $1 AND ($2::timestamptz IS NULL OR created_at_ts >= $2)"
    " ORDER BY created_at_ts, seq LIMIT $3 + 1"
)

# The cursor pull (PROTOCOL §9) in ONE statement, hence one snapshot (§12; issue 14 item
# 10): the vault's sequence and compaction horizon are read with the page, so a compaction
# or a push committing meanwhile is wholly before the page or wholly after it. A vault
# row and no blob beyond the cursor give one row of NULL blob columns; an unknown vault
# none. PROTOCOL §19: the vault's retirement comes with it (NULLs on a live vault); §18's
# digest and count on the row at the head (relay.store.carried_digest). Public:
# the benchmark's raw-database ceiling runs this very statement (bench/ceiling.py).
PULL_PAGE = f"""
SELECT v.seq AS head, v.compacted_through AS horizon, v.retired_at, v.successor,
       v.erase_after, v.erase_after <= now() AS erased, v.successor_statement,
       v.successor_stated_at, {PULL_COLUMNS}, p.*
FROM vaults v LEFT JOIN ({_byte_capped(_CURSOR_ROWS, "seq", within=True)}) p ON true
WHERE v.vault_id = $1
ORDER BY p.seq
"""  # noqa: S608 - constants

_PULL_SINCE = f"""{_byte_capped(_SINCE_ROWS, "created_at_ts, seq", within=False)}
ORDER BY created_at_ts, seq
"""


# `PULL_PAGE`'s first column of the blob (`p.*`): from there on a row holds `SyncBlob`'s
# fields in their order (`_byte_capped`), so a blob is built positionally (issue 36: the
# nine lookups by name per blob were most of a page's Python).
_FIRST_BLOB_COLUMN = 10


def _blobs_with_seq(rows: list[asyncpg.Record]) -> list[SyncBlob]:
    """A cursor page's blobs: the eight fields of §3 and the additive `seq` (§9)."""
    return [SyncBlob(*row[_FIRST_BLOB_COLUMN:]) for row in rows]


def _to_blob(row: asyncpg.Record) -> SyncBlob:
    """The eight fields of §3 (a legacy `since` page: no `seq`)."""
    return SyncBlob(
        vault_id=row["vault_id"],
        memory_id=row["memory_id"],
        device_id=row["device_id"],
        vector_clock=row["vector_clock"],
        ciphertext=row["ciphertext"],
        hmac=row["hmac"],
        created_at=row["created_at"],
        deleted=row["deleted"],
        seq=UNSET,
    )


# PROTOCOL §12 (issue 31 finding 9): whether a device id is bound to a key of the vault,
# revoked or not (api_keys_vault_id_idx). Its own statement: api_keys is a reference table
# on Citus (deploy/SCALING.md), devices a distributed one.
_HAS_BOUND_KEY = "SELECT EXISTS (SELECT 1 FROM api_keys WHERE vault_id = $1 AND device_id = $2)"


# PROTOCOL §12: a device's pull progress, never moved back. EXCLUDED: Citus refuses now() in
# DO UPDATE SET (deploy/SCALING.md §3).
_RECORD_PROGRESS = """
    INSERT INTO devices (vault_id, device_id, pulled_cursor, pulled_at)
    VALUES ($1, $2, $3, now())
    ON CONFLICT (vault_id, device_id) DO UPDATE SET
        pulled_cursor = GREATEST(devices.pulled_cursor, EXCLUDED.pulled_cursor),
        pulled_at = EXCLUDED.pulled_at, last_seen = EXCLUDED.last_seen
"""


async def record_progress(
    conn: asyncpg.Connection, vault_id: str, device_id: str, cursor: int
) -> None:
    """Record that `device_id` pulled `vault_id` through `cursor` (PROTOCOL §12), in a
    transaction of its own whose commit does not wait for the WAL flush
    (`synchronous_commit = off` for it alone; issue 36: one flush per page was most of a
    pull's wall time). Its only reader is compaction, and a progress write lost in a crash
    only leaves a lower cursor: compaction then keeps more tombstones, never fewer
    (docs/pull-progress.md "A lost progress write"). Three round trips, none waiting for the
    disk (BEGIN travels with the SET: `relay.store.begun`)."""
    async with begun(conn, "SET LOCAL synchronous_commit = off"):
        await conn.execute(_RECORD_PROGRESS, vault_id, device_id, cursor)


async def record_progress_at_once(
    conn: asyncpg.Connection, vault_id: str, device_id: str, cursor: int, *, named: bool
) -> None:
    """`record_progress` in ONE round trip, on plain PostgreSQL (issue 36: it took three,
    and a header's device a fourth to look up its bound keys). BEGIN, the SET, the write and
    COMMIT travel in one simple-query message, the ids spelled in hex (`hex_text`: no
    request text in the statement) and the cursor an int. `named`: the device comes from an
    `X-Engram-Device` header, and the write happens only if no key of the vault is bound to
    it, the rule of `progress_device` checked in the same statement (PROTOCOL §12,
    docs/pull-progress.md). Citus keeps `record_progress` (api_keys is a reference table
    there, devices a distributed one)."""
    vault, device = hex_text(vault_id), hex_text(device_id)
    unless = (
        f" WHERE NOT EXISTS (SELECT 1 FROM api_keys WHERE vault_id = {vault}"  # noqa: S608
        f" AND device_id = {device})"
        if named
        else ""
    )
    statement = (
        "BEGIN; SET LOCAL synchronous_commit = off;"
        " INSERT INTO devices (vault_id, device_id, pulled_cursor, pulled_at)"
        f" SELECT {vault}, {device}, {int(cursor)}, now(){unless}"
        " ON CONFLICT (vault_id, device_id) DO UPDATE SET"
        " pulled_cursor = GREATEST(devices.pulled_cursor, EXCLUDED.pulled_cursor),"
        " pulled_at = EXCLUDED.pulled_at, last_seen = EXCLUDED.last_seen; COMMIT"
    )
    try:
        await conn.execute(statement)
    except BaseException:
        # a failed statement leaves the transaction open and aborted (as `begun` does)
        with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
            await conn.execute("ROLLBACK")
        raise


def progress_device(
    bound: str | None, named: str | None, *, named_has_bound_key: bool
) -> str | None:
    """The device whose pull progress a cursor pull records (PROTOCOL §12), or None.

    Progress lets compaction drop tombstones below it, so recording it for a device that
    has not pulled them lets that device miss a deletion and push the memory back. A key
    bound to a device (§10) records its own device, whatever a header names. An unbound
    key (existing daemons) records the device its `X-Engram-Device` header names, unless a
    key of the vault is bound to that device: such a device speaks through its own key, and
    any other key naming it makes a claim it cannot prove (docs/pull-progress.md).
    """
    if bound is not None:
        return bound
    if named is None or named_has_bound_key:
        return None
    return named


@dataclass(frozen=True)
class Page:
    """One page of a pull."""

    blobs: list[SyncBlob]
    has_more: bool
    cursor: int
    head: int = 0  # the vault's sequence (PROTOCOL §17: a restored relay's is lower)
    lag: int = 0  # blobs of the vault still ahead of `cursor` (for metrics)
    retired: Retirement | None = None  # PROTOCOL §19: within its grace period
    carried: CarriedDigest | None = None  # ours: §18 at `head` (relay.store.carried_digest)


def split_page(rows: list[asyncpg.Record], limit: int) -> tuple[list[asyncpg.Record], bool]:
    """The page's rows (with their ciphertext, at most `limit`) and `has_more` (a row off
    the page: past the byte budget or past the limit)."""
    page = [r for r in rows if r["ciphertext"] is not None][:limit]
    return page, len(page) < sum(1 for r in rows if r["seq"] is not None)


async def pull_by_cursor(
    pool: asyncpg.Pool,
    vault_id: str,
    cursor: int,
    limit: int,
    device_id: str | None,
    *,
    max_bytes: int,
    origin: int | None = None,
    named: bool = False,
    at_once: bool = False,
) -> Page:
    """Blobs with seq > cursor in seq order (PROTOCOL §9), at most `limit` of them and
    their ciphertext within `max_bytes` (at least one blob: `_byte_capped`).

    `origin` is the cursor the device began this pull at (an additive parameter,
    docs/pull-origin.md). The compaction horizon is checked against it: a pull that began
    at 0 has seen every blob that survived below its cursor, so its later pages never get
    `resync_required` (before, a new device's pull of a compacted vault failed on page 2
    whenever the horizon lay above page 1).

    `named`: `device_id` comes from an `X-Engram-Device` header, not from the key's binding,
    so its progress is recorded only as `progress_device` allows (PROTOCOL §12).
    `at_once` (plain PostgreSQL, `PushLimits.one_statement`): the progress in one round
    trip (`record_progress_at_once`), so a page costs two; else up to five (Citus)."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(PULL_PAGE, vault_id, cursor, limit, max_bytes)
        retired = _retired(vault_id, rows)
        # nobody pushed to this vault: no row (PROTOCOL §5: an empty page)
        head, horizon = (int(rows[0]["head"]), int(rows[0]["horizon"])) if rows else (0, 0)
        start = cursor if origin is None else min(origin, cursor)
        if 0 < start < horizon:
            raise ResyncRequiredError(cursor, horizon)  # answered 409 by relay.http.errors
        last_row = rows[-1] if rows else None
        rows, has_more = split_page(rows, limit)
        # Read in the page's snapshot, the head is never below a seq sent; it is never
        # raised to the request's cursor either: a head below it is how a device sees a
        # restored relay (PROTOCOL §17).
        new_cursor = int(rows[-1]["seq"]) if rows else cursor
        if not has_more and new_cursor < horizon:
            # PROTOCOL §9, §12 (issue 14 item 9): the page reached the end of the vault in
            # this snapshot and only compacted tombstones lie above its last blob, so the
            # device has seen everything through the head. A cursor below the horizon
            # would earn it `resync_required` at its next pull, and so on forever.
            new_cursor = head
        # The page's blobs built while the database writes the progress (issue 36).
        _, blobs = await while_answered(
            _progress(conn, vault_id, device_id, new_cursor, named=named, at_once=at_once),
            lambda: _blobs_with_seq(rows),
        )
        lag = max(0, head - new_cursor)
        carried = None if last_row is None else carried_by_page(last_row, head, has_more=has_more)
        return Page(blobs, has_more, new_cursor, head, lag, retired, carried)


def _retired(vault_id: str, rows: list[asyncpg.Record]) -> Retirement | None:
    """PROTOCOL §19: the vault's retirement as the page's first row gives it; raises its
    refusal (410, relay.http.errors) once the grace period is over."""
    if not rows or rows[0]["retired_at"] is None:
        return None
    first = rows[0]
    retired = Retirement(vault_id, first["successor"], first["retired_at"], first["erase_after"],
                         first["erased"], first["successor_statement"],
                         first["successor_stated_at"])  # fmt: skip
    if retired.erased:
        raise retired.refusal()
    return retired


async def _progress(
    conn: asyncpg.Connection,
    vault_id: str,
    device_id: str | None,
    cursor: int,
    *,
    named: bool,
    at_once: bool,
) -> None:
    """Record a cursor pull's progress as `pull_by_cursor` says (PROTOCOL §12)."""
    if device_id is None:
        return
    if at_once:
        await record_progress_at_once(conn, vault_id, device_id, cursor, named=named)
        return
    if named:
        bound = await conn.fetchval(_HAS_BOUND_KEY, vault_id, device_id)
        device_id = progress_device(None, device_id, named_has_bound_key=bool(bound))
    if device_id is not None:
        await record_progress(conn, vault_id, device_id, cursor)


async def pull_since(
    pool: asyncpg.Pool, vault_id: str, since: datetime | None, limit: int, *, max_bytes: int
) -> tuple[list[SyncBlob], bool, Retirement | None]:
    """Legacy pull (PROTOCOL §7): created_at >= since as instants, by (created_at, seq),
    capped by count and by ciphertext bytes like the cursor pull; with the vault's
    retirement (PROTOCOL §19; `VaultRetiredError` once its grace period is over)."""
    async with pool.acquire() as conn:
        retired = await retirement(conn, vault_id)
        if retired is not None and retired.erased:
            raise retired.refusal()
        rows = await conn.fetch(_PULL_SINCE, vault_id, since, limit, max_bytes)
    page, has_more = split_page(rows, limit)
    return [_to_blob(r) for r in page], has_more, retired


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
