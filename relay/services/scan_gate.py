"""Admission and a time bound for the statements that pass over a whole vault.

One bucket's digest, list and narrowing (PROTOCOL §18, `relay.store.digest`) read every
row of the vault (revision 0014 took the bucket out of `blobs`): 0.3-0.7 s for 1,000,000
memories (bench.anti_entropy). They are the repair path, rare for an honest device, but a
key holder asking for them in a loop would otherwise cost the database one vault scan per
request, bounded only by the per-key rate. So, per relay process (docs/digest.md
"Bounded scans"):

- a scan runs or waits only while the process, its vault and each of its clients (key,
  account, address) have room (`relay.domain.scan_admission`, the decision: per vault at most 1
  runs and 2 wait, per client 4 places, per process 2 and 8; waiters served round robin
  across vaults), each waiting for at most the time bound; past that a request is
  answered 503 `busy` at once, with Retry-After;
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

from engram_sync.relay.domain.domain_errors import BusyError, ScanTimeoutError
from engram_sync.relay.domain.scan_admission import (
    ENV_PER_CLIENT,
    ENV_VAULT_RUNNING,
    ENV_VAULT_WAITING,
    Refusal,
    ScanClaim,
    ScanLimits,
    ScanQueue,
    Ticket,
)

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

    def __init__(self, limits: ScanLimits, timeout_s: float) -> None:
        problem = limits.problem()
        if problem or not 0 < timeout_s <= 3600:
            raise ValueError(problem or "a scan gate needs 0 < timeout <= 3600")
        self._queue = ScanQueue(limits)
        self._waiters: dict[Ticket, asyncio.Future[None]] = {}
        self.timeout_s = timeout_s
        self.stats = ScanStats()

    @property
    def timeout_ms(self) -> int:
        """The statement timeout, in PostgreSQL's unit (at least 1 ms)."""
        return max(1, round(self.timeout_s * 1000))

    def reader(self, pool: asyncpg.Pool) -> BoundedReader:
        """What a scan reads through: `pool` under this gate's statement timeout."""
        return BoundedReader(pool, self.timeout_ms)

    def vault_places(self, vault_id: str) -> tuple[int, int]:
        """(running, waiting) scans of `vault_id` now (for the tests)."""
        return self._queue.vault_places(vault_id)

    @contextlib.asynccontextmanager
    async def admit(self, claim: ScanClaim) -> AsyncIterator[None]:
        """A place to run one scan of `claim`; 503 `busy` when a bound of the process, the
        vault or a client is reached (relay.domain.scan_admission), or when no place freed up
        within the time bound; 503 `scan_timeout` when the database stopped the statement
        (asyncpg's QueryCanceledError inside the block)."""
        ticket = self._queue.offer(claim)
        if isinstance(ticket, Refusal):
            raise self._busy(ticket)
        self.stats.admitted += 1
        try:
            if not ticket.running:
                await self._wait(ticket)
            try:
                yield
            except asyncpg.QueryCanceledError:
                self.stats.timed_out += 1
                raise ScanTimeoutError(
                    f"this answer needs a pass over the whole vault, which took longer than "
                    f"the relay allows ({self.timeout_s:g} s, ENGRAM_RELAY_SCAN_TIMEOUT_S); "
                    "retry later",
                    TIMEOUT_RETRY_AFTER_S,
                ) from None
            finally:
                self._finish(ticket)
        finally:
            self.stats.admitted -= 1

    async def _wait(self, ticket: Ticket) -> None:
        """Until `ticket` runs; 503 `busy` past the time bound (its place given back)."""
        waiter = self._waiters[ticket] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(self.timeout_s):
                await waiter
        except BaseException as exc:  # the time bound, or the request went away
            self._waiters.pop(ticket, None)
            if ticket.running:  # it was let in as it gave up: pass the place on
                self._finish(ticket)
            else:
                self._queue.withdraw(ticket)
            if isinstance(exc, TimeoutError):
                raise self._busy(Refusal.PROCESS) from None
            raise

    def _finish(self, ticket: Ticket) -> None:
        for started in self._queue.finish(ticket):
            waiter = self._waiters.pop(started)
            if not waiter.done():
                waiter.set_result(None)

    def _busy(self, refusal: Refusal) -> BusyError:
        self.stats.refused_busy += 1
        return BusyError(_BUSY[refusal], BUSY_RETRY_AFTER_S)


_BUSY: Final = {
    Refusal.PROCESS: "the relay is answering as many whole-vault digest requests as it may "
    "(ENGRAM_RELAY_SCAN_MAX_RUNNING, ENGRAM_RELAY_SCAN_MAX_WAITING); retry in a moment",
    Refusal.VAULT: "this vault has as many whole-vault digest requests running and waiting "
    f"as it may ({ENV_VAULT_RUNNING}, {ENV_VAULT_WAITING}); retry in a moment",
    Refusal.CLIENT: "this key, account or client address has as many whole-vault digest "
    f"requests running and waiting as it may ({ENV_PER_CLIENT}); retry in a moment",
}


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
