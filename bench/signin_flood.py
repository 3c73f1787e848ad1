"""A sign-in flood against the relay vs. a device's pull running at the same time.

`python -m bench.signin_flood [--flood 300] [--blobs 500]`: one relay process (served like
`engram-relay serve`) on a new database; a vault of `--blobs` real blobs; then the pull
of that vault timed while idle and while `--flood` wrong sign-ins arrive at once, each
from its own client address (X-Forwarded-For from a trusted proxy hop, 127.0.0.1) and
for its own email, so that no per-address or per-account limit stops them: the worst
case, a botnet's. Prints the pull latencies, how the sign-ins were answered and the
relay's peak of concurrent password hashes (from /metrics, when it has one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import secrets
import time
from collections import Counter
from typing import Any, Final

import httpx

from bench.corpus import Corpus
from bench.relay_load import headers, pull_page, push_all, push_bodies
from bench.relay_process import scratch_relay
from bench.stats import latency_summary

PROXY_ENV: Final = "ENGRAM_RELAY_TRUSTED_PROXIES"
IDLE_PULLS: Final = 20
PAGE: Final = 1000


def _address(n: int) -> str:
    return f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256 + 1}"


async def _signin(client: httpx.AsyncClient, n: int) -> str:
    try:
        response = await client.post(
            "/auth/signin",
            json={"email": f"nobody{n}@example.org", "password": "wrong password " + str(n)},
            headers={"X-Forwarded-For": _address(n)},
        )
    except httpx.HTTPError as exc:
        return type(exc).__name__
    return str(response.status_code)


async def _pull_ms(client: httpx.AsyncClient, vault_id: str) -> float:
    started = time.perf_counter()
    response = await client.get(f"/v1/vaults/{vault_id}/pull", params={"cursor": 0, "limit": PAGE})
    if response.status_code != 200:
        raise RuntimeError(f"pull answered {response.status_code}: {response.text[:200]}")
    return (time.perf_counter() - started) * 1000


def _flood(url: str, flood: int, go: Any, answers: Any) -> None:
    """Child process: send `flood` wrong sign-ins at once when `go` is set."""

    async def attack() -> list[str]:
        limits = httpx.Limits(max_connections=flood, max_keepalive_connections=flood)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as attacker:
            go.wait()
            return await asyncio.gather(*(_signin(attacker, n) for n in range(flood)))

    answers.put(asyncio.run(attack()))


async def _pulls_until(client: httpx.AsyncClient, vault_id: str, done: Any) -> list[float]:
    during = [await _pull_ms(client, vault_id)]
    while done.is_alive():
        during.append(await _pull_ms(client, vault_id))
    return during


def _measure(url: str, key: str, vault_id: str, flood: int) -> dict[str, Any]:
    """Idle pulls, then pulls while the flood (in its own process, so the bench's own
    client work never shows up in the pull's latency) is answered."""
    context = multiprocessing.get_context("spawn")
    go, answers = context.Event(), context.Queue()
    attacker = context.Process(target=_flood, args=(url, flood, go, answers))
    attacker.start()

    async def pulls() -> tuple[list[float], list[float], float]:
        async with httpx.AsyncClient(
            base_url=url, headers=headers(key, "bench-puller"), timeout=120
        ) as puller:
            await _pull_ms(puller, vault_id)  # warm the connection
            idle = [await _pull_ms(puller, vault_id) for _ in range(IDLE_PULLS)]
            await asyncio.sleep(2.0)  # the attacker's interpreter has started
            started = time.perf_counter()
            go.set()
            during = await _pulls_until(puller, vault_id, attacker)
            return idle, during, time.perf_counter() - started

    try:
        idle, during, flood_s = asyncio.run(pulls())
        results: list[str] = answers.get(timeout=60)
    finally:
        attacker.join(timeout=60)
        if attacker.is_alive():
            attacker.kill()
    return {
        "flood": flood,
        "flood_seconds": round(flood_s, 2),
        "signin_answers": dict(Counter(results)),
        "idle_pull_ms": latency_summary(idle, 95),
        "flood_pull_ms": latency_summary(during, 95),
    }


def run(flood: int, blobs: int) -> dict[str, Any]:
    """Start the database and the relay, fill one vault, measure; everything stopped after."""
    os.environ[PROXY_ENV] = "127.0.0.1"  # the bench's own loopback is the trusted proxy hop
    key = "bench-" + secrets.token_hex(16)
    vault_id = "bench-flood-" + secrets.token_hex(4)
    with scratch_relay(key) as relay:
        with httpx.Client(base_url=relay.url, headers=headers(key, "bench-pusher")) as client:
            push_all(client, vault_id, push_bodies(Corpus.make(blobs), vault_id, count=blobs,
                                                  batch=500))  # fmt: skip
            assert len(pull_page(client, vault_id, 0, PAGE).blobs) == min(blobs, PAGE)
        result = _measure(relay.url, key, vault_id, flood)
    result["cpus"] = os.cpu_count()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--flood", type=int, default=300, help="concurrent wrong sign-ins")
    parser.add_argument("--blobs", type=int, default=500, help="blobs in the pulled vault")
    args = parser.parse_args()
    print(json.dumps(run(args.flood, args.blobs), indent=2))


if __name__ == "__main__":
    main()
