"""The background of the live sync latency row (bench.live_latency, issue 15 "Figures"):
`devices` connected devices over `vaults` vaults, and `rate` pushes a second.

Run as its own process (`python -m bench.live_background URL KEY DEVICES VAULTS RATE
[plain]`) so its event loop does not share a GIL with the measured client devices. Each
device is an event stream (PROTOCOL §15) on a raw asyncio connection (bench.live_feed
`_Stream`) asked with `blobs=1` as the client asks it (docs/live-feed.md "Blobs in the
event"): a change carrying the blobs that follow its cursor moves the cursor without a
pull; on any other `change` past its cursor it pulls with a real cursor pull on a
keep-alive connection of its own until the page has no more. With `plain` the streams are
plain hint streams and every hint is pulled (the feed before `events-blobs`). The pushes
are single new blobs, round robin over the vaults, on a fixed schedule (open loop: a slow
answer does not slow the schedule down; at most `PUSHERS` are in flight). It prints
`ready` once every stream is connected and the pushes have begun, and, when its stdin
closes, one JSON line of counts, then exits.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
import uuid
from typing import Any, Final

import httpx
import msgspec

from bench.live_feed import CONNECT_AT_ONCE, _raise_fd_limit, _Stream
from bench.relay_load import BenchError, RawHttpConnection, headers
from engram_sync.shared_format import BlobCipher, SyncKeys

PUSHERS: Final = 20  # push connections; at most this many pushes in flight


class _Page(msgspec.Struct):
    cursor: int
    has_more: bool


class Counts:
    """What the background did (its figures go into the report next to the latency)."""

    def __init__(self) -> None:
        self.pushes = 0
        self.push_errors = 0
        self.late_pushes = 0  # started more than one period after their slot
        self.hints = 0
        self.carried = 0  # changes whose blobs followed the device's cursor: no pull
        self.pulls = 0
        self.pull_errors = 0
        self.errors: list[str] = []

    def error(self, text: str) -> None:
        if len(self.errors) < 5:
            self.errors.append(text[:200])

    def as_json(self, seconds: float) -> dict[str, Any]:
        return {
            "seconds": seconds,
            "pushes": self.pushes,
            "pushes_per_s": self.pushes / max(seconds, 1e-9),
            "push_errors": self.push_errors,
            "late_pushes": self.late_pushes,
            "hints": self.hints,
            "carried": self.carried,
            "pulls": self.pulls,
            "pulls_per_s": self.pulls / max(seconds, 1e-9),
            "pull_errors": self.pull_errors,
            "error_samples": self.errors,
        }


async def _get(conn: RawHttpConnection, path: str) -> tuple[int, bytes]:
    """A GET on the device's keep-alive connection; once more on a new connection when the
    relay had closed the idle one (uvicorn closes keep-alive connections idle for 5 s)."""
    try:
        return await conn.request("GET", path)
    except (OSError, asyncio.IncompleteReadError):
        return await conn.request("GET", path)  # conn.request closed it: a new connection


async def _device(url: httpx.URL, key: str, vault_id: str, stream: _Stream, counts: Counts) -> None:
    """Pull on each hint past the cursor, as a feed-only device does."""
    conn = RawHttpConnection(url.host, url.port or 80, headers(key, str(uuid.uuid4())))
    cursor = 0
    try:
        while True:
            change = await stream.change_event()
            counts.hints += 1
            hint = change.cursor
            if change.after == cursor and change.blobs:
                counts.carried += 1  # the blobs that follow the cursor came with the event
                cursor = hint
            while hint > cursor:
                try:
                    status, body = await _get(conn, f"/v1/vaults/{vault_id}/pull?cursor={cursor}")
                    if status != 200:
                        raise BenchError(f"pull answered {status}: {body[:120]!r}")
                    page = msgspec.json.decode(body, type=_Page)
                except (OSError, asyncio.IncompleteReadError, ValueError, BenchError) as exc:
                    counts.pull_errors += 1
                    counts.error(f"pull: {type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.1)
                    continue
                counts.pulls += 1
                cursor = page.cursor
                if not page.has_more:
                    break
    finally:
        await conn.close()


async def _pushes(
    url: httpx.URL, key: str, vaults: list[str], rate: float, counts: Counts, stop: asyncio.Event
) -> None:
    cipher = BlobCipher(SyncKeys(secrets.token_bytes(32), secrets.token_bytes(32)))
    device = str(uuid.uuid4())
    free: asyncio.Queue[RawHttpConnection] = asyncio.Queue()
    for _ in range(PUSHERS):
        free.put_nowait(RawHttpConnection(url.host, url.port or 80, headers(key, device)))
    period = 1.0 / rate

    async def one(n: int, conn: RawHttpConnection) -> None:
        vault_id = vaults[n % len(vaults)]
        blob = cipher.seal(
            f'{{"content":"background {n}","id":"bg{n}"}}', vault_id=vault_id,
            memory_id=f"bg{n}", device_id=device, vector_clock=1, deleted=False,
        )  # fmt: skip
        try:
            status, body = await conn.request(
                "POST", f"/v1/vaults/{vault_id}/push", msgspec.json.encode({"blobs": [blob]})
            )
            if status != 200:
                raise BenchError(f"push answered {status}: {body[:120]!r}")
            counts.pushes += 1
        except (OSError, asyncio.IncompleteReadError, ValueError, BenchError) as exc:
            counts.push_errors += 1
            counts.error(f"push: {type(exc).__name__}: {exc}")
        finally:
            free.put_nowait(conn)

    started = time.perf_counter()
    n = 0
    tasks: set[asyncio.Task[None]] = set()
    while not stop.is_set():
        slot = started + n * period
        delay = slot - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -period:
            counts.late_pushes += 1
        conn = await free.get()
        task = asyncio.create_task(one(n, conn))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        n += 1
    await asyncio.gather(*tasks)
    while not free.empty():
        await free.get_nowait().close()


async def run(
    base_url: str, key: str, devices: int, vaults: int, rate: float, *, blobs: bool = True
) -> None:
    """Connect, say `ready`, load until stdin closes, print the counts."""
    _raise_fd_limit(2 * devices + 1024)
    url = httpx.URL(base_url)
    vault_ids = [f"bg-{secrets.token_hex(4)}-{i}" for i in range(vaults)]
    counts = Counts()
    streams: list[_Stream] = []
    for first in range(0, devices, CONNECT_AT_ONCE):
        batch = range(first, min(first + CONNECT_AT_ONCE, devices))
        streams += await asyncio.gather(
            *(_Stream.open(url, key, vault_ids[i % vaults], 0, blobs=blobs) for i in batch)
        )
    workers = [
        asyncio.create_task(_device(url, key, vault_ids[i % vaults], s, counts))
        for i, s in enumerate(streams)
    ]
    stop = asyncio.Event()
    pusher = asyncio.create_task(_pushes(url, key, vault_ids, rate, counts, stop))
    started = time.perf_counter()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.read)  # the parent closes stdin to stop us
    stop.set()
    await pusher
    seconds = time.perf_counter() - started
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    await asyncio.gather(*(s.close() for s in streams))
    print(msgspec.json.encode(counts.as_json(seconds)).decode(), flush=True)


if __name__ == "__main__":
    url_, key_, devices_, vaults_, rate_ = sys.argv[1:6]
    plain = sys.argv[6:7] == ["plain"]
    asyncio.run(run(url_, key_, int(devices_), int(vaults_), float(rate_), blobs=not plain))
