"""The live change feed (PROTOCOL §15, issue 15 "Figures"): what idle event streams cost
the relay, and how soon a push wakes a stream.

- Idle subscribers: `subscribers` event streams (`GET /v1/vaults/{v}/events`) over 100
  vaults, each on its own connection of a minimal asyncio client, each read up to its
  `retry:` line; the relay's RSS (its workers included) before and after, once all are
  connected and idle for a ping interval and a second (16 s; 2 s with --quick), plus
  the time PostgreSQL takes to publish its counters (SETTLE_S before and after). The
  relay is told to take that many connections (`ENGRAM_RELAY_MAX_CONNECTIONS`,
  bench.relay_process). The relay database's transactions (pg_stat_database
  `xact_commit + xact_rollback`: every query outside a transaction is one) are counted
  over an idle window of the same length with no streams (the relay's own background:
  health refresh, LISTEN probe) and over the idle window with all of them; the
  difference divided by the subscribers is the database cost of an idle subscriber
  (issue 15: zero).
- Push -> wake: one stream on a vault, then `rounds` single-blob pushes to it one after
  the other; the time from a push's start to its `event: change` arriving on the stream.
  The relay's share of "a memory appears on the other device": the device's own pull,
  decrypt and apply come on top.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import secrets
import sys
import time
import uuid
from typing import Any, Final

import asyncpg
import httpx
import msgspec

from bench.database import BenchDatabase
from bench.monitor import ResourceMonitor
from bench.relay_load import BenchError, headers
from bench.relay_process import RelayProcess
from bench.settings import default_workers
from bench.stats import percentile
from bench.targets import live_feed_targets
from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.services.config import DEFAULT_EVENTS_PING_S
from engram_sync.shared_format import BlobCipher, SyncKeys
from engram_sync.shared_format.wire import ChangeEvent

VAULTS: Final = 100
FULL_SUBSCRIBERS: Final = 10_000
QUICK_SUBSCRIBERS: Final = 200
FULL_ROUNDS: Final = 300
QUICK_ROUNDS: Final = 20
CONNECT_AT_ONCE: Final = 200  # streams opened concurrently while connecting
MB: Final = 1024 * 1024
FULL_IDLE_S: Final = DEFAULT_EVENTS_PING_S + 1.0  # a ping interval (the bench relay's default)
QUICK_IDLE_S: Final = 2.0
# A backend that flushed its counters less than a second ago holds the next ones until it
# has idled PGSTAT_IDLE_INTERVAL (10 s): a read sooner misses the tail of what came before
# (measured: the last connecting streams' reads showed up in the idle window).
SETTLE_S: Final = 11.0
# --quick checks the harness, not the figure: its windows settle 1 s, so its query count
# may take in the tail of what came before (42 s less of a quick run).
QUICK_SETTLE_S: Final = 1.0
QUERY_LIMIT_PER_SUBSCRIBER: Final = 0.01  # "zero", less the noise of the relay's background


class _Stream:
    """One event stream on a raw asyncio connection (HTTP/1.1, chunked)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(
        cls, url: httpx.URL, key: str, vault_id: str, cursor: int, *, blobs: bool = False
    ) -> _Stream:
        host, port = url.host, url.port or 80
        reader, writer = await asyncio.open_connection(host, port)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers(key, str(uuid.uuid4())).items())
        carry = "&blobs=1" if blobs else ""  # docs/live-feed.md "Blobs in the event"
        writer.write(
            f"GET /v1/vaults/{vault_id}/events?cursor={cursor}{carry} HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\n{head}\r\n".encode("latin-1")
        )
        status = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in status.split(b"\r\n", 1)[0]:
            raise BenchError(f"event stream refused: {status[:80]!r}")
        stream = cls(reader, writer)
        if await stream.message() != "retry: 2000":
            raise BenchError("the event stream did not start with retry: 2000")
        return stream

    async def message(self) -> str:
        """The next SSE message's text (chunk framing stripped)."""
        text = ""
        while "\n\n" not in text:
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            if size == 0:
                raise BenchError("the event stream ended")
            text += (await self.reader.readexactly(size + 2))[:-2].decode()
        return text.strip("\n")

    async def change(self) -> int:
        """The cursor of the next `event: change` (pings skipped)."""
        while True:
            text = await self.message()
            if text.startswith("event: change"):
                return int(text.rsplit(":", 1)[1].strip(" }"))

    async def change_event(self) -> ChangeEvent:
        """The data of the next `event: change` (pings skipped), decoded."""
        while True:
            text = await self.message()
            if text.startswith("event: change"):
                data = text.split("\ndata: ", 1)[1]
                return msgspec.json.decode(data, type=ChangeEvent)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


def _raise_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


async def _transactions(database_url: str) -> int:
    """The relay database's committed plus rolled back transactions so far. The read is a
    transaction itself: callers subtract 1 per read between."""
    conn = await asyncpg.connect(to_libpq_url(database_url))
    try:
        value = await conn.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        )
    finally:
        await conn.close()
    return int(value)


async def _window(database_url: str, seconds: float, settle_s: float = SETTLE_S) -> int:
    """Transactions of the relay database during `seconds`, without the read's own (the
    counters read `settle_s` after what came before, and `settle_s` after the window)."""
    await asyncio.sleep(settle_s)
    before = await _transactions(database_url)
    await asyncio.sleep(seconds + settle_s)
    after = await _transactions(database_url)
    return after - before - 1


async def idle_subscribers(
    base_url: str,
    key: str,
    monitor: ResourceMonitor,
    subscribers: int,
    *,
    database_url: str,
    idle_s: float = QUICK_IDLE_S,
    settle_s: float = SETTLE_S,
) -> dict[str, Any]:
    """RSS of the relay before and with `subscribers` idle event streams, and the database
    transactions of an idle window with them against one without."""
    _raise_fd_limit(subscribers + 1024)
    url = httpx.URL(base_url)
    vaults = [f"feed-{secrets.token_hex(4)}-{i}" for i in range(VAULTS)]
    # The relay at rest: "before" is not the last phase's tail; its background's queries.
    background = await _window(database_url, idle_s, settle_s)
    before = monitor.rss_mb()
    streams: list[_Stream] = []
    started = time.perf_counter()
    try:
        for first in range(0, subscribers, CONNECT_AT_ONCE):
            batch = range(first, min(first + CONNECT_AT_ONCE, subscribers))
            streams += await asyncio.gather(
                *(_Stream.open(url, key, vaults[i % VAULTS], 0) for i in batch)
            )
        connect_s = time.perf_counter() - started
        idle = await _window(database_url, idle_s, settle_s)
        after = monitor.rss_mb()
    finally:
        await asyncio.gather(*(s.close() for s in streams))
    extra = max(0.0, after - before)
    return {
        "subscribers": subscribers,
        "vaults": VAULTS,
        "connect_s": connect_s,
        "idle_s": idle_s,
        "settle_s": settle_s,  # before and after each window (SETTLE_S: the counters' delay)
        "rss_before_mb": before,
        "rss_idle_mb": after,
        "extra_rss_mb": extra,
        "extra_kib_per_subscriber": extra * 1024 / subscribers,
        "limit_mb": 200.0 * subscribers / FULL_SUBSCRIBERS,
        "db_transactions_background": background,
        "db_transactions_idle": idle,
        "db_queries_per_subscriber": max(0, idle - background) / subscribers,
        "db_queries_limit_per_subscriber": QUERY_LIMIT_PER_SUBSCRIBER,
    }


async def push_to_wake(base_url: str, key: str, rounds: int) -> dict[str, Any]:
    """Milliseconds from a push's start to its change hint on a stream of the vault."""
    vault_id = f"wake-{secrets.token_hex(6)}"
    cipher = BlobCipher(SyncKeys(secrets.token_bytes(32), secrets.token_bytes(32)))
    device = str(uuid.uuid4())
    latencies: list[float] = []
    stream = await _Stream.open(httpx.URL(base_url), key, vault_id, 0)
    try:
        async with httpx.AsyncClient(
            base_url=base_url, headers=headers(key, device), timeout=60
        ) as http:
            for i in range(rounds):
                blob = cipher.seal(
                    f'{{"content":"live {i}","id":"m{i}"}}',
                    vault_id=vault_id,
                    memory_id=f"m{i}",
                    device_id=device,
                    vector_clock=1,
                    deleted=False,
                )
                body = msgspec.json.encode({"blobs": [blob]})
                started = time.perf_counter()
                answer = await http.post(f"/v1/vaults/{vault_id}/push", content=body)
                answer.raise_for_status()
                head = answer.json()["cursor"]
                while await stream.change() < head:
                    pass
                latencies.append((time.perf_counter() - started) * 1000)
    finally:
        await stream.close()
    latencies.sort()
    return {
        "rounds": rounds,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies),
    }


def measure(
    loop: asyncio.Runner,
    monitor: ResourceMonitor,
    base_url: str,
    key: str,
    *,
    quick: bool,
    database_url: str,
    settled: bool | None = None,
) -> dict[str, Any]:
    """The report's `live_feed` section (`database_url`: the relay's database, for the
    idle subscribers' query count; `settled`: its windows settle SETTLE_S, by default
    unless `quick`, which checks the harness only)."""
    settled = not quick if settled is None else settled
    subscribers = QUICK_SUBSCRIBERS if quick else FULL_SUBSCRIBERS
    rounds = QUICK_ROUNDS if quick else FULL_ROUNDS
    idle_s = QUICK_IDLE_S if quick else FULL_IDLE_S
    with monitor.phase("live_feed_idle"):
        idle = loop.run(
            idle_subscribers(
                base_url,
                key,
                monitor,
                subscribers,
                idle_s=idle_s,
                database_url=database_url,
                settle_s=SETTLE_S if settled else QUICK_SETTLE_S,
            )
        )
    with monitor.phase("live_feed_wake"):
        wake = loop.run(push_to_wake(base_url, key, rounds))
    return {"idle": idle, "wake": wake}


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.live_feed [--quick] [--workers N]`: figure 13 alone, on its own
    embedded PostgreSQL and relay; prints its verdicts and the section as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.live_feed", description=main.__doc__)
    parser.add_argument("--quick", action="store_true", help="200 streams, 20 pushes")
    parser.add_argument("--workers", type=int, default=None, help="relay worker processes")
    args = parser.parse_args(argv)
    workers = args.workers or default_workers()
    key = "bench-" + secrets.token_urlsafe(24)
    with BenchDatabase() as db, RelayProcess(db.url, key, db.scratch / "relay.log", workers) as r:
        monitor = ResourceMonitor(r.pid, db.postmaster_pid()).start()
        try:
            with asyncio.Runner() as loop:
                section = measure(loop, monitor, r.url, key, quick=args.quick, database_url=db.url)
        finally:
            monitor.stop()
    print(json.dumps({"workers": workers, **section}, indent=1))
    for target in live_feed_targets(section):
        row = target.as_json()
        print(f"{row['verdict']}  {row['name']}: {row['value']:.4g} ({row['target']}) "
              f"{row['detail']}", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
