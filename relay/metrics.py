"""Prometheus metrics of one relay process (served at `/metrics`).

A registry per app instance, so several apps in one process (tests) never clash.
Labels carry route templates and reasons, never vault ids, keys or payloads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class _PoolCollector(Collector):
    def __init__(self, pool_stats: Callable[[], tuple[int, int, int]]) -> None:
        self._pool_stats = pool_stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        size, idle, max_size = self._pool_stats()
        family = GaugeMetricFamily(
            "engram_relay_db_pool_connections", "Database pool connections", labels=["state"]
        )
        family.add_metric(["open"], size)
        family.add_metric(["idle"], idle)
        family.add_metric(["in_use"], size - idle)
        family.add_metric(["max"], max_size)
        yield family


class RelayMetrics:
    """The relay's counters and histograms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
        self.blobs_pulled = Counter("engram_relay_blobs_pulled", "Blobs served", registry=r)
        self.tombstones_compacted = Counter(
            "engram_relay_tombstones_compacted", "Tombstones removed by compaction", registry=r
        )
        self.vaults = Gauge("engram_relay_vaults", "Vaults on this relay", registry=r)
        self.live_blobs = Gauge("engram_relay_live_blobs", "Live (non-deleted) blobs", registry=r)
        self.tombstones = Gauge(
            "engram_relay_tombstones",
            "Tombstones stored (compaction removes those every active device pulled past)",
            registry=r,
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
        """Export pool (open, idle, max) connection counts on every scrape."""
        self.registry.register(_PoolCollector(pool_stats))

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
