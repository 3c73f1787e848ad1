"""Prometheus metrics of the relay (served at `/metrics`, behind a token: relay.http.routes.system).

A registry per app instance, so several apps in one process (tests) never clash.
Labels carry route templates and reasons, never vault ids, keys or payloads.

With `serve --workers N` every worker records its values in files of a private
directory the supervisor made (`PROMETHEUS_MULTIPROC_DIR`, relay.serving.server), and a scrape,
whichever worker answers it, sums the counters and histograms of all of them
(prometheus-client's multiprocess mode). Gauges say how they combine: the database-wide
ones (vaults, blobs, tombstones) take the most recent value any worker set, the pool
gauges add up the live workers' pools.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
# prometheus-client reads it once, at import: a worker is spawned with it already set.
MULTIPROC_DIR_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir() -> str | None:
    """The directory the workers share their values in, when running under `--workers N`."""
    return os.environ.get(MULTIPROC_DIR_ENV) or None


class RelayMetrics:
    """The relay's counters, gauges and histograms."""

    # long: every metric the relay exports, declared once with its help text
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._pool_stats: Callable[[], tuple[int, int, int]] | None = None
        r = self.registry
        self.requests = Counter(
            "engram_relay_requests", "HTTP requests", ["route", "method", "status"], registry=r
        )
        self.latency = Histogram(
            "engram_relay_request_seconds",
            "HTTP request latency",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.pushes = Counter("engram_relay_pushes", "Committed pushes", registry=r)
        self.blobs_accepted = Counter(
            "engram_relay_blobs_accepted", "Blobs accepted by pushes", registry=r
        )
        self.blobs_rejected = Counter(
            "engram_relay_blobs_rejected", "Blobs rejected by pushes", ["reason"], registry=r
        )
        self.pulls = Counter("engram_relay_pulls", "Pulls served", ["mode"], registry=r)
        # issue 36 (relay.domain.key_gate): minted-key lookups in the database, and requests
        # refused before one
        self.key_lookups = Counter(
            "engram_relay_key_lookups", "Minted-key lookups in the database", registry=r
        )
        self.key_gate_refusals = Counter(
            "engram_relay_key_gate_refusals",
            "Requests refused before a key lookup",
            ["kind"],
            registry=r,
        )
        self.blobs_pulled = Counter("engram_relay_blobs_pulled", "Blobs served", registry=r)
        self.tombstones_compacted = Counter(
            "engram_relay_tombstones_compacted", "Tombstones removed by compaction", registry=r
        )
        self.maintenance_rounds = Counter(
            "engram_relay_maintenance_rounds",
            "Background maintenance rounds (relay.services.maintenance) by outcome: ran, skipped "
            "(another replica held the lock) or failed",
            ["outcome"],
            registry=r,
        )
        self.expired_erased = Counter(
            "engram_relay_expired_erased",
            "Expired rows erased by background maintenance (handoff seals and requests, "
            "pairing codes, sessions)",
            ["kind"],
            registry=r,
        )

        self.scrubs = Counter(
            "engram_relay_scrubs",
            "Vaults the background scrub recomputed from their rows (relay.store.scrub) by "
            "outcome: clean, repaired (the stored digest was untrue) or timed_out",
            ["outcome"],
            registry=r,
        )
        self.scrub_mismatches = Counter(
            "engram_relay_scrub_mismatches",
            "Scrubs that found a vault's stored digest, counts or bucket prefixes untrue "
            "(rows lost or changed outside a push or compaction) and made them true again",
            registry=r,
        )

        def database_wide(name: str, documentation: str) -> Gauge:
            """A figure of the whole database: whichever worker set it last is right."""
            return Gauge(name, documentation, registry=r, multiprocess_mode="mostrecent")

        self.vaults = database_wide("engram_relay_vaults", "Vaults on this relay")
        self.live_blobs = database_wide("engram_relay_live_blobs", "Live (non-deleted) blobs")
        self.tombstones = database_wide(
            "engram_relay_tombstones",
            "Tombstones stored (compaction removes those every active device pulled past)",
        )
        self.relay_processes = database_wide(
            "engram_relay_processes",
            "Live relay processes (replicas x workers) that share each key's rate limit",
        )
        self.pool_connections = Gauge(
            "engram_relay_db_pool_connections",
            "Database pool connections (summed over live worker processes)",
            ["state"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.pull_lag = Histogram(
            "engram_relay_pull_lag_blobs",
            "Blobs still ahead of a device after a cursor pull (vault sequence - cursor)",
            buckets=(0, 1, 10, 100, 1000, 10_000, 100_000, 1_000_000),
            registry=r,
        )
        self.push_group_size = Histogram(
            "engram_relay_push_group_pushes",
            "Pushes committed together by one push transaction (group commit)",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=r,
        )

    def watch_pool(self, pool_stats: Callable[[], tuple[int, int, int]]) -> None:
        """Export pool (open, idle, max) connection counts, read now and on every scrape
        and health refresh (`refresh_pool`)."""
        self._pool_stats = pool_stats
        self.refresh_pool()

    def refresh_pool(self) -> None:
        """Set the pool gauges from the watched pool (a no-op before `watch_pool`)."""
        if self._pool_stats is None:
            return
        size, idle, max_size = self._pool_stats()
        for state, value in (
            ("open", size),
            ("idle", idle),
            ("in_use", size - idle),
            ("max", max_size),
        ):
            self.pool_connections.labels(state).set(value)

    def render(self) -> bytes:
        """The text exposition format: this process's registry, or with `--workers N` every
        worker's values combined."""
        self.refresh_pool()
        directory = multiprocess_dir()
        if directory is None:
            return generate_latest(self.registry)
        combined = CollectorRegistry()
        MultiProcessCollector(combined, path=directory)  # type: ignore[no-untyped-call]
        return generate_latest(combined)
