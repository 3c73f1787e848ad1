"""Admission and a time bound for the statements that pass over a whole vault.

One bucket's digest, list and narrowing (PROTOCOL §18, `relay.store.digest`) read every
row of the vault (revision 0014 took the bucket out of `blobs`): 0.3-0.7 s for 1,000,000
memories (bench.anti_entropy). They are the repair path, rare for an honest device, but a
key holder asking for them in a loop would otherwise cost the database one vault scan per
request, bounded only by the per-key rate. So, per relay process (docs/digest.md
"Bounded scans"):

- at most `running` of them run at once and at most `waiting` more wait, each for at most
  the time bound; past that a request is answered 503 `busy` at once, with Retry-After;
- each runs under PostgreSQL's `statement_timeout` (`SET LOCAL`, so the database itself
  stops it, even when this process is gone); one that passes it is answered 503
  `scan_timeout` with Retry-After. Nothing was changed: the statements only read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final

import asyncpg

from engram_sync.relay.errors import RelayError, busy

BUSY_RETRY_AFTER_S: Final = 1
TIMEOUT_RETRY_AFTER_S: Final = 5


@dataclass
class ScanStats:
    """What the gate did (read by the tests; no metric of its own: the request counter
    counts the 503s by route)."""

    admitted: int = 0  # running plus waiting now
    refused_busy: int = 0
    timed_out: int = 0


class ScanGate:
    """Per-process admission of whole-vault scans, and their statement timeout."""

    def __init__(self, running: int, waiting: int, timeout_s: float) -> None:
        if running < 1 or waiting < 0 or not 0 < timeout_s <= 3600:
            raise ValueError("a scan gate needs running >= 1, waiting >= 0, 0 < timeout <= 3600")
        self._slots = asyncio.Semaphore(running)
        self._capacity = running + waiting
        self.timeout_s = timeout_s
        self.stats = ScanStats()

    @property
    def timeout_ms(self) -> int:
        """The statement timeout, in PostgreSQL's unit (at least 1 ms)."""
        return max(1, round(self.timeout_s * 1000))

    def reader(self, pool: asyncpg.Pool) -> BoundedReader:
        """What a scan reads through: `pool` under this gate's statement timeout."""
        return BoundedReader(pool, self.timeout_ms)

    @contextlib.asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        """A place to run one scan; 503 `busy` when the process holds its cap, or when no
        slot freed up within the time bound; 503 `scan_timeout` when the database stopped
        the statement (asyncpg's QueryCanceledError inside the block)."""
        if self.stats.admitted >= self._capacity:
            raise self._busy()
        self.stats.admitted += 1
        try:
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self._slots.acquire()
            except TimeoutError:
                raise self._busy() from None
            try:
                yield
            except asyncpg.QueryCanceledError:
                self.stats.timed_out += 1
                raise RelayError(
                    503,
                    "scan_timeout",
                    f"this answer needs a pass over the whole vault, which took longer than "
                    f"the relay allows ({self.timeout_s:g} s, ENGRAM_RELAY_SCAN_TIMEOUT_S); "
                    "retry later",
                    headers={"Retry-After": str(TIMEOUT_RETRY_AFTER_S)},
                ) from None
            finally:
                self._slots.release()
        finally:
            self.stats.admitted -= 1

    def _busy(self) -> RelayError:
        self.stats.refused_busy += 1
        return busy(
            "the relay is answering as many whole-vault digest requests as it may "
            "(ENGRAM_RELAY_SCAN_MAX_RUNNING, ENGRAM_RELAY_SCAN_MAX_WAITING); retry in a moment",
            BUSY_RETRY_AFTER_S,
        )


@dataclass(frozen=True)
class BoundedReader:
    """Reads the way `relay.store.digest` asks (`fetch`), each statement in a read-only
    transaction of its own under `statement_timeout`."""

    pool: asyncpg.Pool
    timeout_ms: int

    async def fetch(self, query: str, *args: object) -> list[asyncpg.Record]:
        """`query`'s rows; asyncpg's QueryCanceledError when the timeout stopped it."""
        async with self.pool.acquire() as conn, conn.transaction(readonly=True):
            # an int, formatted: SET takes no bind parameters
            await conn.execute(f"SET LOCAL statement_timeout = {int(self.timeout_ms)}")
            rows: list[asyncpg.Record] = await conn.fetch(query, *args)
            return rows
