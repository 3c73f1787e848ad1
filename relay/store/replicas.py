"""The live relay processes (migration 0011_relay_processes): heartbeats and their count.

Issue 18, deploy/SCALING.md §1: a key's rate limit holds across replicas and `--workers`
when every process enforces rate/N of it, N the relay processes alive on this database.
Each process writes its heartbeat in the periodic health refresh (relay.serving.app) and counts
the rows whose heartbeat has not expired; requests never query this table.

Two plain statements, never one with a data-modifying CTE: on Citus the table is a
reference table (relay.db.citus) and each statement stays simple for it. The database's
clock decides expiry (`now()`), so the hosts' clocks need not agree.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass, field

import asyncpg

__all__ = ["HEARTBEATS_TO_EXPIRE", "Replica", "heartbeat", "leave"]

#: A process whose heartbeat is this many of its own refresh periods old no longer counts.
HEARTBEATS_TO_EXPIRE = 3
# Rows expired this long ago are deleted by the next process that stops cleanly.
_FORGET_AFTER_S = 3600

_BEAT = (
    "INSERT INTO relay_processes (process_id, label, expires_at)"
    " VALUES ($1, $2, now() + make_interval(secs => $3))"
    " ON CONFLICT (process_id) DO UPDATE"
    # EXCLUDED (the inserted row's now()), not now(): Citus refuses functions that are not
    # IMMUTABLE in DO UPDATE SET, on reference tables too (deploy/SCALING.md §3).
    " SET heartbeat_at = EXCLUDED.heartbeat_at, expires_at = EXCLUDED.expires_at"
)
_COUNT_LIVE = "SELECT count(*) FROM relay_processes WHERE expires_at > now()"
_LEAVE = (
    "DELETE FROM relay_processes"
    " WHERE process_id = $1 OR expires_at < now() - make_interval(secs => $2)"
)


def _label() -> str:
    return f"{socket.gethostname()[:200]}:{os.getpid()}"


@dataclass(frozen=True)
class Replica:
    """This relay process (one app instance) as the table knows it."""

    period_secs: float  # how often it beats (the health refresh period)
    process_id: str = field(default_factory=lambda: secrets.token_hex(12))
    label: str = field(default_factory=_label)

    @property
    def expires_after_secs(self) -> float:
        """How long one heartbeat keeps this process counted."""
        return HEARTBEATS_TO_EXPIRE * self.period_secs


async def heartbeat(conn: asyncpg.Connection, replica: Replica) -> int:
    """Write `replica`'s heartbeat; return the live processes, itself included (>= 1)."""
    await conn.execute(_BEAT, replica.process_id, replica.label, replica.expires_after_secs)
    live: int = await conn.fetchval(_COUNT_LIVE)
    return max(1, live)


async def leave(conn: asyncpg.Connection | asyncpg.Pool, replica: Replica) -> None:
    """Delete `replica`'s row (the others count one process fewer at their next refresh),
    and rows that expired long ago (crashed processes)."""
    await conn.execute(_LEAVE, replica.process_id, float(_FORGET_AFTER_S))
