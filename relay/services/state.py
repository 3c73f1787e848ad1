"""What one relay process holds in memory: config, pool, limiter, metrics, health cache.

Nothing here is authoritative: every fact lives in PostgreSQL, so any number of
replicas can serve one database.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import asyncpg
from msgspec import UNSET, UnsetType

from engram_sync.relay.domain.api_keys import Principal
from engram_sync.relay.domain.key_gate import KeyGate
from engram_sync.relay.domain.ratelimit import RateLimiter
from engram_sync.relay.domain.stream_holders import StreamHolders
from engram_sync.relay.services.change_hub import ChangeHub
from engram_sync.relay.services.config import RelayConfig
from engram_sync.relay.services.metrics import RelayMetrics
from engram_sync.relay.services.push_groups import PushGroups
from engram_sync.relay.services.scan_gate import ScanGate
from engram_sync.relay.store.push import PushLimits


@dataclass
class HealthCounters:
    """The compatible /health counters, refreshed in the background (PROTOCOL §5, §11)."""

    vaults: int = 0
    total_blobs: int = 0
    db_size_bytes: int = 0


@dataclass
class RelayState:
    """Per-process state shared by the handlers."""

    config: RelayConfig
    metrics: RelayMetrics
    limiter: RateLimiter = field(default_factory=RateLimiter)  # per key, per second
    # issue 36: refusals decided before a key's lookup (relay.domain.key_gate)
    key_gate: KeyGate = field(default_factory=KeyGate)
    # Per IP, email or account, per minute (relay.http.routes.account_support.limit_per_minute).
    minute_limiter: RateLimiter = field(default_factory=RateLimiter.per_minute)
    started: float = field(default_factory=time.monotonic)
    health: HealthCounters = field(default_factory=HealthCounters)
    pool: asyncpg.Pool | None = None
    static_keys: dict[bytes, Principal] = field(default_factory=dict)
    push_groups: PushGroups | None = None
    # the push's limits; `one_statement` set at startup (plain PostgreSQL, issue 36)
    push_limits: PushLimits | None = None
    hub: ChangeHub | None = None  # PROTOCOL §15: the live change feed (relay.services.change_hub)
    # PROTOCOL §15: who holds the hub's waiters, capped per key, account, address
    holders: StreamHolders | None = None
    scans: ScanGate | None = None  # PROTOCOL §18: whole-vault scans (relay.services.scan_gate)
    # PROTOCOL §17: read at startup, refreshed with the health counters (relay.serving.app);
    # sent in /v1/info and every push and pull answer without a query of its own.
    generation: str | UnsetType = UNSET

    def require_pool(self) -> asyncpg.Pool:
        """The pool; only None before startup finished."""
        if self.pool is None:
            raise RuntimeError("database pool is not open yet")
        return self.pool

    def require_hub(self) -> ChangeHub:
        """The change hub; only None before the app was built."""
        if self.hub is None:
            raise RuntimeError("the change hub is not set up")
        return self.hub

    def require_holders(self) -> StreamHolders:
        """The per-holder stream caps; only None before the app was built."""
        if self.holders is None:
            raise RuntimeError("the stream holders are not set up")
        return self.holders

    def require_scans(self) -> ScanGate:
        """The scan gate; only None before the app was built."""
        if self.scans is None:
            raise RuntimeError("the scan gate is not set up")
        return self.scans

    def require_push_groups(self) -> PushGroups:
        """The push lanes; only None before the app was built."""
        if self.push_groups is None:
            raise RuntimeError("push groups are not set up")
        return self.push_groups
