"""One key tries to hold thousands of event streams vs. other devices' pushes and pulls
(issue 31 finding 2; docs/live-feed.md "Who may hold how many streams").

`python -m bench.stream_hog [--streams 2000] [--devices 50] [--seconds 30] [--ramp 15]`:
one relay process (served like `engram-relay serve`, production defaults: 1,000
connections, 8 streams a key, 64 an address) on a new database. A hog, in a process of
its own, holds `--streams` slots, each opening `GET /v1/vaults/{v}/events` on a new
connection with one minted key (its rate limit the default, 100 requests/s, as an
abusive account's key has) and holding the stream until the relay ends it; a refused
slot retries after a second, an ended one at once. After `--ramp` seconds (at 100
streams a second, more than enough to fill 1,000 connections before the fix), `--devices`
devices push one blob and pull, each request on a new connection (each must get past
the connection cap), for `--seconds`. Prints how the hog's attempts were answered, the
most streams it held at once, and the devices' latencies and failures: the bench's
target is 0 failures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import secrets
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import asyncpg
import httpx

from bench.corpus import Corpus
from bench.relay_load import headers, push_bodies
from bench.relay_process import RelayProcess, scratch_relay
from bench.stats import latency_summary
from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.store.minted_keys import create_key

HOG_RATE: Final = 100  # requests/second: a minted key's default (relay.domain.api_keys)
VAULTS: Final = 5  # the devices' vaults
REFUSED_PAUSE_S: Final = 1.0
# The relay's production defaults, whatever the bench's own relay (bench.relay_process)
# lifts for its 10,000-stream figure.
PRODUCTION: Final = {
    "ENGRAM_RELAY_MAX_CONNECTIONS": "1000",
    "ENGRAM_RELAY_EVENTS_MAX_PER_KEY": "8",
    "ENGRAM_RELAY_EVENTS_MAX_PER_ADDRESS": "64",
}


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def _slot(
    port: int, request: bytes, stop: float, tally: Counter[str], held: list[int]
) -> None:
    """One of the hog's slots: a stream on a new connection, again and again."""
    while time.monotonic() < stop:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            tally["connect_failed"] += 1
            await asyncio.sleep(REFUSED_PAUSE_S)
            continue
        try:
            writer.write(request)
            status = (await reader.readline())[9:12].decode(errors="replace") or "closed"
            tally[status] += 1
            if status == "200":
                held[0] += 1
                held[1] = max(held[1], held[0])
                try:
                    while data := await asyncio.wait_for(
                        reader.read(65536), stop - time.monotonic()
                    ):
                        if b"evicted" in data:
                            tally["evicted"] += 1
                finally:
                    held[0] -= 1
                tally["stream_ended"] += 1
            else:
                await asyncio.sleep(REFUSED_PAUSE_S)
        except (OSError, TimeoutError, ValueError):
            tally["stream_closed"] += 1
        finally:
            writer.close()


def _hog(port: int, key: str, vault: str, streams: int, seconds: float, results: Any) -> None:
    """Child process: `streams` slots for `seconds`."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    request = (
        f"GET /v1/vaults/{vault}/events?cursor=0 HTTP/1.1\r\nHost: relay\r\n"
        f"Authorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    ).encode()

    async def run() -> dict[str, Any]:
        tally: Counter[str] = Counter()
        held = [0, 0]  # now, peak
        stop = time.monotonic() + seconds
        await asyncio.gather(*(_slot(port, request, stop, tally, held) for _ in range(streams)))
        return {"attempts_answered": dict(tally), "peak_streams_open_at_hog": held[1]}

    results.put(asyncio.run(run()))


async def _device(
    url: str, key: str, vault: str, bodies: list[bytes], stop: float
) -> tuple[list[float], Counter[str]]:
    """Push one blob and pull, each on a new connection, until `stop`."""
    latencies: list[float] = []
    failures: Counter[str] = Counter()
    hdrs = headers(key, "bench-" + secrets.token_hex(4)) | {"Connection": "close"}
    async with httpx.AsyncClient(base_url=url, headers=hdrs, timeout=60) as client:
        n = 0
        while time.monotonic() < stop:
            for method, path, body in (
                ("POST", f"/v1/vaults/{vault}/push", bodies[n % len(bodies)]),
                ("GET", f"/v1/vaults/{vault}/pull?cursor=0&limit=10", None),
            ):
                started = time.perf_counter()
                try:
                    response = await client.request(method, path, content=body)
                except httpx.HTTPError as exc:
                    failures[type(exc).__name__] += 1
                    continue
                if response.status_code == 200:
                    latencies.append((time.perf_counter() - started) * 1000)
                else:
                    failures[f"{response.status_code} {response.text[:80]}"] += 1
            n += 1
    return latencies, failures


async def _mint(database_url: str, vault: str) -> str:
    conn = await asyncpg.connect(to_libpq_url(database_url))
    try:
        _, key = await create_key(conn, vault_id=vault, is_admin=False, rate=HOG_RATE)
        return key
    finally:
        await conn.close()


@contextlib.contextmanager
def _relay(key: str, database_url: str | None, scratch: Path | None) -> Iterator[RelayProcess]:
    if database_url is None or scratch is None:
        with scratch_relay(key) as relay:
            yield relay
    else:  # a second relay on the run's database (`python -m bench`): stateless replicas
        with RelayProcess(database_url, key, scratch / "stream-hog-relay.log") as relay:
            yield relay


def run(
    streams: int,
    devices: int,
    seconds: float,
    ramp: float,
    max_connections: int | None = None,
    *,
    database_url: str | None = None,
    scratch: Path | None = None,
) -> dict[str, Any]:
    """Relay (production limits; on a new database unless given one), hog and devices;
    everything stopped after."""
    key = "bench-" + secrets.token_hex(16)
    env = dict(PRODUCTION)
    if max_connections is not None:
        env["ENGRAM_RELAY_MAX_CONNECTIONS"] = str(max_connections)
    hog_vault = "bench-hog-" + secrets.token_hex(4)
    vaults = [f"bench-dev{i}-" + secrets.token_hex(4) for i in range(VAULTS)]
    corpus = Corpus.make(40)
    bodies = {v: [b for _, b in push_bodies(corpus, v, count=40, batch=1)] for v in vaults}
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with _environ(env), _relay(key, database_url, scratch) as relay:
        hog_key = asyncio.run(_mint(relay.database_url, hog_vault))
        hog = context.Process(
            target=_hog, args=(relay.port, hog_key, hog_vault, streams, ramp + seconds + 2, results)
        )
        hog.start()
        try:
            time.sleep(ramp)

            async def all_devices() -> list[tuple[list[float], Counter[str]]]:
                stop = time.monotonic() + seconds
                return await asyncio.gather(
                    *(
                        _device(
                            relay.url, key, vaults[i % VAULTS], bodies[vaults[i % VAULTS]], stop
                        )
                        for i in range(devices)
                    )
                )

            outcomes = asyncio.run(all_devices())
            hog_result = results.get(timeout=120)
        finally:
            hog.join(timeout=60)
            if hog.is_alive():
                hog.kill()
    latencies = [ms for found, _ in outcomes for ms in found]
    failures: Counter[str] = Counter()
    for _, found in outcomes:
        failures.update(found)
    return {
        "hog_streams_tried": streams,
        "devices": devices,
        "seconds": seconds,
        "ramp_s": ramp,
        "limits": env,
        "hog": hog_result,
        "device_requests": len(latencies) + sum(failures.values()),
        "device_failures": sum(failures.values()),
        "device_failure_kinds": dict(failures.most_common(5)),
        "device_ms": latency_summary(latencies, 99) if latencies else None,
        "cpus": os.cpu_count(),
    }


def measure(database_url: str, scratch: Path, *, quick: bool) -> dict[str, Any]:
    """The report's `stream_hog` section (`python -m bench`), on the run's database;
    quick: the connection cap scaled down with the hog, which still tries to hold twice it."""
    if quick:
        return run(200, 10, 4.0, 3.0, 100, database_url=database_url, scratch=scratch)
    return run(2000, 50, 30.0, 15.0, database_url=database_url, scratch=scratch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--streams", type=int, default=2000, help="streams the hog tries to hold")
    parser.add_argument("--devices", type=int, default=50, help="devices pushing and pulling")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the devices run")
    parser.add_argument("--ramp", type=float, default=15.0, help="hog's head start, seconds")
    parser.add_argument("--max-connections", type=int, help="the relay's connection cap")
    args = parser.parse_args()
    result = run(args.streams, args.devices, args.seconds, args.ramp, args.max_connections)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
