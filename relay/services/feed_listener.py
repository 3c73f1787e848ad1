"""The one LISTEN connection of a relay process (PROTOCOL §15).

It listens on `engram_vault_changes` ('<vault_id> <seq>', from every process's pushes),
`engram_vault_commits` (a small commit's blobs as JSON, just before its change:
relay.store.feed_notify; a payload not ours is ignored, the change that follows still wakes)
and `engram_vault_revocations` ('<vault_id>'), and hands them to the process's
`ChangeHub`. Its own connection, not a pooled one (a pooled connection must never keep
a LISTEN: relay.db.pool), tagged `application_name=engram-relay-listen <pid>` (the
process id tells an operator, or a test, whose connection it is). When the
connection is lost it reconnects with backoff (0.1 s doubling to 5 s, with jitter) and
then reads the heads of every watched vault and wakes every waiter to re-check: a lost
notification can delay a device, never make it miss data (the cursor is the truth).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from typing import Final

import asyncpg

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.services.change_hub import ChangeHub
from engram_sync.relay.store.feed_notify import (
    CHANGES,
    COMMITS,
    REVOCATIONS,
    parse_commit,
    vault_heads,
)

log = logging.getLogger(__name__)

APPLICATION_NAME: Final = "engram-relay-listen"
FIRST_BACKOFF_S: Final = 0.1
MAX_BACKOFF_S: Final = 5.0
# How often the connection is probed (`SELECT 1`): one query per process, never per
# waiter; it finds a connection that died without the socket saying so.
PROBE_EVERY_S: Final = 30.0
_CONNECT_TIMEOUT_S: Final = 10.0


class FeedListener:
    """Keeps one LISTEN connection up for `hub`; `start()` returns at once."""

    def __init__(
        self, database_url: str, hub: ChangeHub, *, probe_every_s: float = PROBE_EVERY_S
    ) -> None:
        self._url = to_libpq_url(database_url)
        self._hub = hub
        self._probe_every_s = probe_every_s
        self._task: asyncio.Task[None] | None = None
        self.connections = 0  # connections made so far (the first one included)
        self.ignored_commits = 0  # COMMITS payloads that were not ours (logged)

    def start(self) -> None:
        """Connect in the background (a database down at start-up is retried too)."""
        self._task = asyncio.create_task(self._run(), name="engram-feed-listener")

    async def stop(self) -> None:
        """Cancel the loop and close the connection."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        backoff = FIRST_BACKOFF_S
        while True:
            before = self.connections
            try:
                await self._listen_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # lost, or the database is away: try again later
                if self.connections > before:
                    backoff = FIRST_BACKOFF_S  # it was up: start over from the shortest wait
                log.warning(
                    "change feed listener down: %s; retrying in %.1fs",
                    type(exc).__name__,
                    backoff,
                    extra={"error": type(exc).__name__, "retry_s": backoff},
                )
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))  # noqa: S311 - jitter
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _listen_once(self) -> None:
        """One connection's life: listen, catch up, then wait until it is lost."""
        conn: asyncpg.Connection = await asyncpg.connect(
            self._url,
            timeout=_CONNECT_TIMEOUT_S,
            server_settings={
                "application_name": f"{APPLICATION_NAME} {os.getpid()}",
                "timezone": "UTC",
            },
        )
        lost = asyncio.Event()
        try:
            conn.add_termination_listener(lambda _c: lost.set())
            await conn.add_listener(COMMITS, self._on_commit)
            await conn.add_listener(CHANGES, self._on_change)
            await conn.add_listener(REVOCATIONS, self._on_revocation)
            self.connections += 1
            # Listening now: whatever commits from here on is heard. What committed while
            # no connection listened is found by reading the heads, then every waiter
            # re-checks. The first connection of a process does it too (harmless: no
            # waiter may have started before the listener was up, but some can have).
            watched = self._hub.watched()
            heads = await vault_heads(conn, watched) if watched else {}
            self._hub.recheck_all(heads)
            if self.connections > 1:
                log.info("change feed listener reconnected", extra={"vaults": len(watched)})
            while not lost.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._probe_every_s):
                        await lost.wait()
                if not lost.is_set():
                    await conn.fetchval("SELECT 1", timeout=_CONNECT_TIMEOUT_S)
            raise ConnectionError("LISTEN connection lost")
        finally:
            with contextlib.suppress(Exception):
                conn.terminate()

    def _on_change(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        vault_id, _, seq = payload.rpartition(" ")
        try:
            self._hub.publish(vault_id, int(seq))
        except ValueError:
            log.warning("change notification with a bad payload ignored")

    def _on_commit(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        commit = parse_commit(payload)
        if commit is None:
            # Not ours: an older relay's space-separated payload during a rolling upgrade
            # (docs/live-feed.md "Channels and payloads"), or malformed. Harmless: the
            # vault's `engram_vault_changes` follows in the same statement and wakes its
            # waiters, whose devices pull. Logged once, then every 1,000th.
            self.ignored_commits += 1
            if self.ignored_commits % 1000 == 1:
                log.warning(
                    "commit notification with a payload not ours ignored",
                    extra={"ignored": self.ignored_commits},
                )
            return
        self._hub.publish_commits((commit,))

    def _on_revocation(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self._hub.recheck(payload)
