"""The load generator: the relay's push and pull over real HTTP (httpx, msgspec bodies)."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import uuid
from dataclasses import dataclass, field

import httpx

from bench.corpus import Corpus
from engram_sync.shared_format.wire import (
    PullResponse,
    PushRequest,
    PushResponse,
    decode_json,
    encode_json,
)


class BenchError(RuntimeError):
    """The relay answered something a correct relay never answers to this load."""


def headers(key: str, device_id: str) -> dict[str, str]:
    """What a device sends with every request."""
    return {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "X-Engram-Device": device_id,
    }


def checked_push(response: httpx.Response, expected: int) -> PushResponse:
    """The push's answer, refused unless it accepted all `expected` blobs."""
    if response.status_code != 200:
        raise BenchError(f"push answered {response.status_code}: {response.text[:300]}")
    answer = decode_json(response.content, PushResponse)
    if answer.accepted != expected or answer.rejected:
        raise BenchError(
            f"push accepted {answer.accepted} of {expected} ({len(answer.rejected)} rejected)"
        )
    return answer


def push_bodies(
    corpus: Corpus,
    vault_id: str,
    *,
    count: int,
    batch: int,
    start: int = 0,
    device_id: str = "bench-pusher",
) -> list[tuple[int, bytes]]:
    """(blobs, msgspec-encoded body) of each push request, built before any clock starts:
    the push figure is the relay's (HTTP, validation, transaction), not the encoder's."""
    return [
        (len(blobs), encode_json(PushRequest(blobs=blobs)))
        for blobs in corpus.batches(
            vault_id=vault_id, device_id=device_id, start=start, count=count, batch=batch
        )
    ]


def push_all(client: httpx.Client, vault_id: str, bodies: list[tuple[int, bytes]]) -> float:
    """Send the pushes one after the other, like one device; returns the seconds."""
    path = f"/v1/vaults/{vault_id}/push"
    started = time.perf_counter()
    for size, body in bodies:
        checked_push(client.post(path, content=body), size)
    return time.perf_counter() - started


def pull_page(client: httpx.Client, vault_id: str, cursor: int, page: int) -> PullResponse:
    """One cursor pull, decoded like a device decodes it."""
    response = client.get(f"/v1/vaults/{vault_id}/pull", params={"cursor": cursor, "limit": page})
    if response.status_code != 200:
        raise BenchError(f"pull answered {response.status_code}: {response.text[:300]}")
    return decode_json(response.content, PullResponse)


def pull_all(client: httpx.Client, vault_id: str, *, page: int) -> tuple[float, int]:
    """Page through the whole vault with the cursor; returns (seconds, blobs)."""
    cursor = 0
    blobs = 0
    started = time.perf_counter()
    while True:
        answer = pull_page(client, vault_id, cursor, page)
        blobs += len(answer.blobs)
        cursor = answer.cursor if isinstance(answer.cursor, int) else cursor
        if not answer.has_more or not answer.blobs:
            break
    return time.perf_counter() - started, blobs


def incremental_pull_ms(
    client: httpx.Client, vault_id: str, cursor: int, *, expected: int, times: int, page: int
) -> float:
    """Median milliseconds of `times` pulls from `cursor` (each returns `expected` blobs)."""
    timings: list[float] = []
    for _ in range(times):
        started = time.perf_counter()
        answer = pull_page(client, vault_id, cursor, page)
        timings.append((time.perf_counter() - started) * 1000)
        if len(answer.blobs) != expected or answer.has_more:
            raise BenchError(f"incremental pull returned {len(answer.blobs)}, not {expected}")
    return statistics.median(timings)


@dataclass
class LatencyRun:
    """Per-request latencies (ms) of one concurrency run."""

    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def error(self, text: str) -> None:
        """Count one failed request (and keep the first few for the report)."""
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(text[:200])


class RawHttpConnection:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams, for the latency test.

    One connection per device, one request at a time, `Content-Length` bodies only
    (what the relay sends). It costs the load generator a few tens of microseconds per
    request, so on a small machine the latencies measured are the relay's, not the
    client library's queueing (httpx's async client saturated a core in trials).
    """

    def __init__(self, host: str, port: int, head: dict[str, str]) -> None:
        self.host = host
        self.port = port
        fixed = {"Host": f"{host}:{port}", **head}
        self._head = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("latin-1")
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self._reader, self._writer

    async def close(self) -> None:
        """Close the connection (a later request opens a new one)."""
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST `body`; returns (status, response body). Raises OSError on a broken link."""
        return await self.request("POST", path, body)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """One request; returns (status, response body). Raises OSError on a broken link."""
        reader, writer = await self._connect()
        try:
            writer.write(
                method.encode("ascii") + b" " + path.encode("ascii") + b" HTTP/1.1\r\n"
                + self._head
                + b"Content-Length: " + str(len(body)).encode("ascii") + b"\r\n\r\n" + body
            )  # fmt: skip
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = None
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            if length is None:
                raise OSError("response without Content-Length")
            return status, await reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            await self.close()
            raise


async def concurrent_single_pushes(
    base_url: str,
    key: str,
    corpus: Corpus,
    *,
    vault_ids: list[str],
    duration: float,
) -> LatencyRun:
    """Device k pushes single new blobs to `vault_ids[k]` back to back for `duration` s.

    Closed loop, no think time: each device sends its next push as soon as the last
    one is answered, on its own keep-alive connection. Every push is a new memory (the
    vaults must be fresh).
    """
    url = httpx.URL(base_url)
    run = LatencyRun()
    counter = 0

    def next_body(vault_id: str, device_id: str) -> bytes:
        nonlocal counter
        blob = corpus.envelope(counter, vault_id=vault_id, device_id=device_id, clock=1)
        counter += 1
        return encode_json(PushRequest(blobs=[blob]))

    async def device(vault_id: str, conn: RawHttpConnection, device_id: str,
                     measure_until: float | None) -> None:  # fmt: skip
        path = f"/v1/vaults/{vault_id}/push"
        while True:
            body = next_body(vault_id, device_id)
            started = time.perf_counter()
            if measure_until is not None and started >= measure_until:
                return
            try:
                status, answer = await conn.post(path, body)
                elapsed = (time.perf_counter() - started) * 1000
                if status != 200:
                    raise BenchError(f"push answered {status}: {answer[:200]!r}")
                pushed = decode_json(answer, PushResponse)
                if pushed.accepted != 1:
                    raise BenchError(f"push accepted {pushed.accepted} of 1")
            except (OSError, asyncio.IncompleteReadError, ValueError, BenchError) as exc:
                run.error(f"{type(exc).__name__}: {exc}")
            else:
                run.latencies_ms.append(elapsed)
            if measure_until is None:
                return  # warm-up: one push per device opens its connection

    devices = []
    for vault_id in vault_ids:
        device_id = str(uuid.uuid4())
        conn = RawHttpConnection(url.host, url.port or 80, headers(key, device_id))
        devices.append((vault_id, conn, device_id))
    try:
        await asyncio.gather(*(device(v, c, d, None) for v, c, d in devices))  # warm-up
        run.latencies_ms.clear()
        run.errors = 0
        run.error_samples.clear()
        started = time.perf_counter()
        deadline = started + duration
        await asyncio.gather(*(device(v, c, d, deadline) for v, c, d in devices))
        run.seconds = time.perf_counter() - started
    finally:
        for _, conn, _ in devices:
            await conn.close()
    return run
