"""Background maintenance: what `engram-relay gc` does, done by a serving relay.

Every `maintenance_interval_secs` (ENGRAM_RELAY_MAINTENANCE_INTERVAL_S, default 300; 0
turns it off) each relay process tries PostgreSQL's advisory lock `MAINTENANCE_LOCK_KEY`
(`pg_try_advisory_xact_lock`, never waiting). The one that gets it compacts tombstones
(PROTOCOL §12, the same rule and code as `gc`) and erases expired handoff seals and
requests, pairing codes and sessions (PROTOCOL §13, §14), accounts' keys revoked over 30
days ago and the blobs of retired vaults whose grace period is over (PROTOCOL §19,
relay.store.retire), then scrubs at most ENGRAM_RELAY_SCRUB_PER_ROUND vaults not
scrubbed within ENGRAM_RELAY_SCRUB_INTERVAL_S, least recently scrubbed first (PROTOCOL
§18, relay.store.scrub: the stored digest made true from the rows, each under the scan
timeout), then lets the lock go; every other replica or worker skips that round. A round
that fails is logged and counted, never raised: the next one tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Final

import asyncpg

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.services.metrics import RelayMetrics
from engram_sync.relay.services.state import RelayState
from engram_sync.relay.store.accounts import purge_expired_sessions
from engram_sync.relay.store.compaction import CompactionResult, compact_vaults
from engram_sync.relay.store.handoff import purge_expired_requests
from engram_sync.relay.store.idempotency import purge_expired_keys
from engram_sync.relay.store.minted_keys import purge_revoked_keys
from engram_sync.relay.store.pairing import purge_expired_codes
from engram_sync.relay.store.retire import erase_expired
from engram_sync.relay.store.scrub import ScrubResult, scrub_due

__all__ = [
    "MAINTENANCE_LOCK_KEY",
    "ScrubPlan",
    "Sweep",
    "locked_sweep",
    "maintenance_round",
    "start",
    "stop",
]

log = logging.getLogger(__name__)

# The advisory lock one maintenance round holds: "engramgc" in ASCII (also
# 7308892986227386211). relay.db.migrate's lock is "engram01"; the per-vault locks are
# transaction-scoped hashes of text keys.
MAINTENANCE_LOCK_KEY: Final = 0x656E6772616D6763
_CONNECT_TIMEOUT_S: Final = 15


@dataclass(frozen=True)
class Sweep:
    """What one round removed: per-vault compaction results and expired rows by kind."""

    compacted: list[CompactionResult]
    erased: dict[str, int]
    scrubbed: list[ScrubResult] = field(default_factory=list)

    @property
    def tombstones_removed(self) -> int:
        """Tombstones removed over every vault."""
        return sum(r.removed for r in self.compacted)


async def purge_expired(conn: asyncpg.Connection) -> dict[str, int]:
    """Everything that expired, over every vault: handoff seals and rows, pairing codes,
    sessions (PROTOCOL §13, §14), accounts' keys revoked more than 30 days ago
    (relay.store.minted_keys.REVOKED_KEY_KEPT), and the blobs of retired vaults past their
    grace period (PROTOCOL §19: `retired_vaults` counts vaults); rows touched by kind."""
    return {
        "handoff_requests": await purge_expired_requests(conn),
        "idempotency_keys": await purge_expired_keys(conn),
        "pairing_codes": await purge_expired_codes(conn),
        "sessions": await purge_expired_sessions(conn),
        "retired_vaults": await erase_expired(conn),
        "revoked_keys": await purge_revoked_keys(conn),
    }


async def sweep(conn: asyncpg.Connection, retention: timedelta) -> Sweep:
    """Compact every vault and erase everything expired, on `conn` (what `gc` runs)."""
    compacted = await compact_vaults(conn, retention)
    return Sweep(compacted, await purge_expired(conn))


@dataclass(frozen=True)
class ScrubPlan:
    """How a round scrubs (relay.store.scrub): vaults not scrubbed for `interval_s`, at
    most `per_round` of them, each pass under `timeout_ms`."""

    interval_s: float
    per_round: int
    timeout_ms: int


async def locked_sweep(
    pool: asyncpg.Pool, database_url: str, retention: timedelta, scrub: ScrubPlan | None = None
) -> Sweep | None:
    """One `sweep` (on a pooled connection), then the scrubs `scrub` asks for, while a
    session of its own holds the maintenance lock; None, at once, when another session
    holds it."""
    async with _maintenance_lock(database_url) as got:
        if not got:
            return None
        async with pool.acquire() as conn:
            done = await sweep(conn, retention)
            if scrub is not None:
                done.scrubbed.extend(
                    await scrub_due(conn, scrub.interval_s, scrub.per_round, scrub.timeout_ms)
                )
            return done


@contextlib.asynccontextmanager
async def _maintenance_lock(database_url: str) -> AsyncIterator[bool]:
    """Whether this round got the lock, held until the block ends.

    Transaction-level (`pg_try_advisory_xact_lock` in a transaction left open for the
    round) on a short-lived connection of its own, outside the pool: closing it always
    lets the lock go, even behind a pooler in transaction mode (a session-level lock
    would stay on whichever server connection took it), and a round never waits for a
    second pooled connection (`ENGRAM_RELAY_POOL_SIZE=1`). Read committed and without a
    transaction id, the idle transaction holds back no vacuum.
    """
    conn = await asyncpg.connect(
        to_libpq_url(database_url),
        timeout=_CONNECT_TIMEOUT_S,
        server_settings={"application_name": "engram-relay maintenance"},
    )
    try:
        await conn.execute("BEGIN")
        got: bool = await conn.fetchval(
            "SELECT pg_try_advisory_xact_lock($1)", MAINTENANCE_LOCK_KEY
        )
        yield got
    finally:
        try:
            await conn.close(timeout=_CONNECT_TIMEOUT_S)  # ends the transaction: unlocked
        except BaseException:
            conn.terminate()
            raise


async def maintenance_round(
    pool: asyncpg.Pool,
    database_url: str,
    retention: timedelta,
    metrics: RelayMetrics,
    scrub: ScrubPlan | None = None,
) -> Sweep | None:
    """One round: run, skip (lock held elsewhere) or fail; counted, logged, never raised."""
    try:
        done = await locked_sweep(pool, database_url, retention, scrub)
    except Exception as exc:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            # Stopping (relay shutdown): a query cut short may surface as asyncpg's
            # InterfaceError instead of the cancellation; swallowed, the task would go on.
            raise asyncio.CancelledError from exc
        metrics.maintenance_rounds.labels("failed").inc()
        sqlstate = getattr(exc, "sqlstate", None)
        log.warning(
            "maintenance round failed: %s%s",
            type(exc).__name__,
            f" (SQLSTATE {sqlstate})" if sqlstate else "",
            extra={"error": type(exc).__name__, "sqlstate": sqlstate},
        )
        return None
    if done is None:
        metrics.maintenance_rounds.labels("skipped").inc()
        log.debug("maintenance round skipped: another relay process holds the lock")
        return None
    metrics.maintenance_rounds.labels("ran").inc()
    metrics.tombstones_compacted.inc(done.tombstones_removed)
    for kind, count in done.erased.items():
        metrics.expired_erased.labels(kind).inc(count)
    if done.tombstones_removed or any(done.erased.values()):
        log.info(
            "maintenance removed %d tombstone(s) from %d vault(s); erased %s",
            done.tombstones_removed,
            sum(1 for r in done.compacted if r.removed),
            ", ".join(f"{n} {kind}" for kind, n in done.erased.items()),
            extra={"tombstones_removed": done.tombstones_removed, **done.erased},
        )
    report_scrubs(done.scrubbed, metrics)
    return done


def report_scrubs(scrubbed: list[ScrubResult], metrics: RelayMetrics | None) -> None:
    """Count the scrubs and log each one that found an untrue vault row, naming the vault
    (ids and counts only: the relay holds nothing secret of a vault's contents)."""
    for result in scrubbed:
        if result.outcome == "gone":
            continue
        if metrics is not None:
            metrics.scrubs.labels(result.outcome).inc()
        if result.outcome == "repaired":
            if metrics is not None:
                metrics.scrub_mismatches.inc()
            log.warning(
                "scrub: vault %s's stored digest disagreed with its rows (%s; %d version(s) "
                "claimed, %d held): made true, its devices' next check re-pushes what is lost",
                result.vault_id,
                ", ".join(result.differed),
                result.stored_count,
                result.row_count,
                extra={
                    "vault_id": result.vault_id,
                    "differed": list(result.differed),
                    "stored_count": result.stored_count,
                    "row_count": result.row_count,
                },
            )
        elif result.outcome == "timed_out":
            log.warning(
                "scrub: vault %s took longer than the scan timeout; skipped until its next turn",
                result.vault_id,
                extra={"vault_id": result.vault_id},
            )


async def _maintain(state: RelayState) -> None:
    config = state.config
    interval = config.maintenance_interval_secs
    retention = timedelta(days=config.tombstone_retention_days)
    scrub = None
    if config.scrub_interval_secs > 0:
        timeout_ms = max(1, round(config.scan_timeout_s * 1000))
        scrub = ScrubPlan(config.scrub_interval_secs, config.scrub_per_round, timeout_ms)
    while True:
        await asyncio.sleep(interval)
        await maintenance_round(
            state.require_pool(), config.database_url, retention, state.metrics, scrub
        )


def start(state: RelayState) -> asyncio.Task[None] | None:
    """Start the rounds (call once the pool is open); None when the interval is 0 (off)."""
    if state.config.maintenance_interval_secs <= 0:
        return None
    return asyncio.create_task(_maintain(state), name="engram-relay-maintenance")


async def stop(task: asyncio.Task[None] | None) -> None:
    """Stop the rounds before the pool closes (a round cut short rolls back its vault)."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception as exc:  # never fail the shutdown over it
        log.warning("maintenance stopped with %s", type(exc).__name__)
