"""The ceiling: raw asyncpg on the relay's own tables, with the relay's own statements.

Writes are the relay's set-based blob upsert (`relay.store.push.BLOB_UPSERT`: unnest
arrays, one statement per batch of 500, each its own durable commit); reads are the
cursor pull's keyset query (`relay.store.sync.PULL_PAGE`) on the `(vault_id, seq)`
index, 1,000 rows a page.
No HTTP, no validation, no per-vault lock: what the database and driver can do.
Vault ids of the ceiling are separate from the relay's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count
from typing import Any

import asyncpg

from bench.corpus import Corpus
from bench.relay_load import LatencyRun
from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.domain.push_rules import CheckedBlob
from engram_sync.relay.services.config import DEFAULT_MAX_PAGE_BYTES
from engram_sync.relay.store.push import BLOB_UPSERT, blob_columns
from engram_sync.relay.store.sync import PULL_PAGE, split_page
from engram_sync.shared_format.timestamps import parse_rfc3339
from engram_sync.shared_format.wire import SyncBlob


def columns(blobs: Sequence[SyncBlob], first_seq: int) -> list[list[Any]]:
    """The arrays of one batch, as the relay builds them for `BLOB_UPSERT`."""
    return blob_columns(
        [
            (b.vault_id, CheckedBlob(i, b, parse_rfc3339(b.created_at), len(b.ciphertext)), seq)
            for i, (b, seq) in enumerate(zip(blobs, count(first_seq), strict=False))
        ]
    )


async def connect(url: str) -> asyncpg.Connection:
    """A connection set up like the relay's pool (UTC sessions)."""
    return await asyncpg.connect(to_libpq_url(url), server_settings={"timezone": "UTC"})


@dataclass(frozen=True)
class Prepared:
    """One vault's upsert batches, built before any clock starts."""

    vault_id: str
    batches: list[list[list[Any]]]
    last_seq: int
    size_bytes: int

    @property
    def count(self) -> int:
        """Blobs in all batches."""
        return sum(len(cols[0]) for cols in self.batches)


def prepare(
    corpus: Corpus, vault_id: str, *, count: int, batch: int, start: int = 0, first_seq: int = 1
) -> Prepared:
    """The unnest arrays of blobs start..start+count-1, seq numbers from `first_seq`."""
    batches: list[list[list[Any]]] = []
    seq = first_seq
    for blobs in corpus.batches(
        vault_id=vault_id, device_id="ceiling-device", start=start, count=count, batch=batch
    ):
        batches.append(columns(blobs, seq))
        seq += len(blobs)
    size = sum(sum(cols[10]) for cols in batches)
    return Prepared(vault_id, batches, seq - 1, size)


async def begin_vault(conn: asyncpg.Connection, prepared: Prepared) -> None:
    """The vault row the blobs' foreign key needs."""
    await conn.execute(
        "INSERT INTO vaults (vault_id) VALUES ($1) ON CONFLICT DO NOTHING", prepared.vault_id
    )


async def end_vault(conn: asyncpg.Connection, prepared: Prepared) -> None:
    """The vault row's `seq` and `bytes_used` made to match the blobs written, so the relay
    can continue the vault."""
    await conn.execute(
        "UPDATE vaults SET seq = $2, bytes_used = bytes_used + $3 WHERE vault_id = $1",
        prepared.vault_id,
        prepared.last_seq,
        prepared.size_bytes,
    )


async def write(conn: asyncpg.Connection, prepared: Prepared) -> float:
    """Upsert the prepared batches, each its own commit; returns the seconds they took
    (`begin_vault` before the clock, `end_vault` after it)."""
    await begin_vault(conn, prepared)
    started = time.perf_counter()
    for cols in prepared.batches:
        await conn.execute(BLOB_UPSERT, *cols)
    elapsed = time.perf_counter() - started
    await end_vault(conn, prepared)
    return elapsed


async def concurrent_single_upserts(
    url: str, corpus: Corpus, *, connections: int, duration: float, tag: str
) -> LatencyRun:
    """The raw statement under the relay latency test's concurrency (issue 36): connection k
    upserts one new blob at a time into vault `raw-<tag>-<k>` with `BLOB_UPSERT`, each its
    own commit, back to back for `duration` s (a warm-up statement first). No HTTP, no
    lock, no vault row: what one blob's durable write costs at that concurrency."""
    run = LatencyRun()
    conns = [await connect(url) for _ in range(connections)]
    counter = count()

    async def one(conn: asyncpg.Connection, vault_id: str, until: float | None) -> None:
        while True:
            index = next(counter)  # a new memory each time, as the relay's test pushes
            blob = corpus.envelope(index, vault_id=vault_id, device_id="raw-device", clock=1)
            cols = columns([blob], index + 1)
            started = time.perf_counter()
            if until is not None and started >= until:
                return
            await conn.execute(BLOB_UPSERT, *cols)
            if until is None:
                return
            run.latencies_ms.append((time.perf_counter() - started) * 1000)

    try:
        vaults = [f"raw-{tag}-{k}" for k in range(connections)]
        for conn, vault_id in zip(conns, vaults, strict=True):
            await conn.execute("INSERT INTO vaults (vault_id) VALUES ($1) ON CONFLICT DO NOTHING",
                               vault_id)  # fmt: skip
        await asyncio.gather(*(one(c, v, None) for c, v in zip(conns, vaults, strict=True)))
        started = time.perf_counter()
        until = started + duration
        await asyncio.gather(*(one(c, v, until) for c, v in zip(conns, vaults, strict=True)))
        run.seconds = time.perf_counter() - started
    finally:
        for conn in conns:
            await conn.close()
    return run


async def read(conn: asyncpg.Connection, vault_id: str, *, page: int) -> tuple[float, int]:
    """Read the whole vault by cursor pages; returns (seconds, rows)."""
    cursor = 0
    rows_read = 0
    started = time.perf_counter()
    while True:
        fetched = await conn.fetch(PULL_PAGE, vault_id, cursor, page, DEFAULT_MAX_PAGE_BYTES)
        rows, has_more = split_page(fetched, page)
        rows_read += len(rows)
        if not rows:
            break
        cursor = rows[-1]["seq"]
        if not has_more:
            break
    return time.perf_counter() - started, rows_read
