"""The ceiling and the relay measured in lockstep (issue 36: push/ceiling and pull/ceiling
as medians of interleaved repeats, robust on a shared machine).

Before, a repeat timed the ceiling's whole write, then the relay's whole push, then one
read of each: a 50 ms ceiling read of fresh rows (the first read of a row also sets its
hint bits) against a relay pull a second later, so a burst of load on either side moved
the ratio by 2x (pull repeats 0.29-1.58 in one quiet run). Here:

- **writes**: batch i of the ceiling (`ceiling.write_batch`, the relay's `BLOB_UPSERT`, its
  own commit) and push i of the relay (one HTTP request of the same batch size) alternate,
  the side going first alternating too; each side's seconds are the sum of its own steps.
- **reads**: both vaults are first read once untimed (rows in the same state on both
  sides: written, then read once), then `passes` more times, page i of the ceiling
  (`PULL_PAGE`, raw asyncpg) and page i of the relay (an HTTP cursor pull, decoded like a
  device decodes it) alternating the same way.

Each side's clock runs only around its own step (the ceiling's inside the coroutine), so
neither pays for the other nor for the harness between them; the ceiling runs the same
statements on the same connection as before, never slower.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx

from bench import ceiling
from bench.relay_load import BenchError, checked_push, pull_page
from engram_sync.relay.services.config import DEFAULT_MAX_PAGE_BYTES
from engram_sync.relay.store.push import BLOB_UPSERT
from engram_sync.relay.store.sync import PULL_PAGE, split_page

READ_PASSES = 5  # timed reads of each vault per repeat, after one untimed read


@dataclass
class Sides:
    """Seconds and items of the ceiling and of the relay, summed over their own steps."""

    ceiling_s: float = 0.0
    relay_s: float = 0.0
    ceiling_items: int = 0
    relay_items: int = 0

    def rates(self) -> tuple[float, float]:
        """(ceiling, relay) items per second."""
        return (self.ceiling_items / max(self.ceiling_s, 1e-9),
                self.relay_items / max(self.relay_s, 1e-9))  # fmt: skip


async def _timed_upsert(conn: asyncpg.Connection, cols: list[list[Any]]) -> float:
    started = time.perf_counter()
    await conn.execute(BLOB_UPSERT, *cols)
    return time.perf_counter() - started


def _timed_push(http: httpx.Client, path: str, size: int, body: bytes) -> float:
    started = time.perf_counter()
    checked_push(http.post(path, content=body), size)
    return time.perf_counter() - started


def write(
    loop: asyncio.Runner,
    conn: asyncpg.Connection,
    prepared: ceiling.Prepared,
    http: httpx.Client,
    relay_vault: str,
    bodies: list[tuple[int, bytes]],
) -> Sides:
    """The ceiling's batches and the relay's pushes, alternating (see the module)."""
    if len(prepared.batches) != len(bodies):
        raise ValueError("the ceiling and the relay must write the same batches")
    sides = Sides()
    loop.run(ceiling.begin_vault(conn, prepared))
    path = f"/v1/vaults/{relay_vault}/push"
    for i, (cols, (size, body)) in enumerate(zip(prepared.batches, bodies, strict=True)):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            if side == 0:
                sides.ceiling_s += loop.run(_timed_upsert(conn, cols))
                sides.ceiling_items += len(cols[0])
            else:
                sides.relay_s += _timed_push(http, path, size, body)
                sides.relay_items += size
    loop.run(ceiling.end_vault(conn, prepared))
    return sides


async def _ceiling_page(
    conn: asyncpg.Connection, vault_id: str, cursor: int, page: int
) -> tuple[float, int, int, bool]:
    """(seconds, rows, next cursor, has_more) of one raw page read."""
    started = time.perf_counter()
    fetched = await conn.fetch(PULL_PAGE, vault_id, cursor, page, DEFAULT_MAX_PAGE_BYTES)
    rows, has_more = split_page(fetched, page)
    took = time.perf_counter() - started
    return took, len(rows), (rows[-1]["seq"] if rows else cursor), has_more and bool(rows)


def _relay_page(
    http: httpx.Client, vault_id: str, cursor: int, page: int
) -> tuple[float, int, int, bool]:
    """(seconds, blobs, next cursor, has_more) of one relay cursor pull."""
    started = time.perf_counter()
    answer = pull_page(http, vault_id, cursor, page)
    took = time.perf_counter() - started
    after = answer.cursor if isinstance(answer.cursor, int) else cursor
    return took, len(answer.blobs), after, answer.has_more and bool(answer.blobs)


def read(
    loop: asyncio.Runner,
    conn: asyncpg.Connection,
    ceiling_vault: str,
    http: httpx.Client,
    relay_vault: str,
    *,
    page: int,
    passes: int = READ_PASSES,
) -> Sides:
    """One untimed read of both vaults, then `passes` timed ones, page by page alternating."""
    sides = Sides()
    for p in range(passes + 1):
        warm = p == 0
        c_cursor = r_cursor = 0
        c_more = r_more = True
        i = 0
        while c_more or r_more:
            for side in (0, 1) if i % 2 == 0 else (1, 0):
                if side == 0 and c_more:
                    took, rows, c_cursor, c_more = loop.run(
                        _ceiling_page(conn, ceiling_vault, c_cursor, page)
                    )
                    if not warm:
                        sides.ceiling_s += took
                        sides.ceiling_items += rows
                elif side == 1 and r_more:
                    took, rows, r_cursor, r_more = _relay_page(http, relay_vault, r_cursor, page)
                    if not warm:
                        sides.relay_s += took
                        sides.relay_items += rows
            i += 1
    if sides.ceiling_items != sides.relay_items:
        raise BenchError(
            f"the ceiling read {sides.ceiling_items} rows, the relay {sides.relay_items} blobs"
        )
    return sides
