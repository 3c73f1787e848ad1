"""Small statistics: min/median/max over repeats, percentiles of latencies."""

from __future__ import annotations

import contextlib
import math
import os
import statistics
from collections.abc import Iterator, Sequence
from typing import Any


@contextlib.contextmanager
def load_around(loads: dict[str, dict[str, float]], name: str) -> Iterator[None]:
    """Record the 1-minute load average (/proc/loadavg) before and after the block, as
    `loads[name]` (issue 36: absolute rows are printed with the load beside them)."""
    before = os.getloadavg()[0]
    try:
        yield
    finally:
        loads[name] = {"before": before, "after": os.getloadavg()[0]}


def summary(values: Sequence[float], unit: str) -> dict[str, Any]:
    """`{"min", "median", "max", "values", "unit"}` of the repeats of one figure."""
    if not values:
        raise ValueError("no values to summarise")
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "values": list(values),
        "unit": unit,
    }


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values, nearest-rank method."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def rate(count: int, seconds: float) -> float:
    """Items per second (inf never happens: a measured phase takes > 0 s)."""
    return count / max(seconds, 1e-9)


def latency_summary(values: Sequence[float], percent: int) -> dict[str, float | int]:
    """`{"n", "median", "p<percent>", "max"}` of latencies in ms, rounded to 0.1 ms
    (`{"n": 0}` for none); the percentile is the value at index int(n * percent / 100)."""
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "n": len(values),
        "median": round(statistics.median(values), 1),
        f"p{percent}": round(
            ordered[min(len(ordered) - 1, int(len(ordered) * (percent / 100)))], 1
        ),
        "max": round(max(values), 1),
    }
