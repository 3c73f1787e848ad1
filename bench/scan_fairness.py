"""Figure 12, the repair path under another account's flood of narrowings (PROTOCOL §18;
docs/digest.md "Bounded scans"; issue 31 finding 7).

A flood vault of 100,000 memories (10,000 with `--quick`) written straight in SQL
(bench.anti_entropy's vault), narrowed by its own key (`POST .../digest/narrow`) from 12
concurrent clients without pause; meanwhile a victim vault's own key asks its bucket
digests (`GET .../digest?bucket=B`, the device's repair path) one after the other, 40
times. Both keys are operator keys minted for their vault alone (two tenants); both
clients come from 127.0.0.1 (one address: the victim shares the address bound with the
flood, the worst case for it). Counted: the victim's answers (the target: >= 95% answered
200), their latency, and how the flood was answered.

Alone: `python -m bench.scan_fairness [--quick] [--rows N] [--flooders N] [--asks N]` (its
own embedded PostgreSQL and relay process; prints the JSON and the PASS/FAIL line).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import secrets
import sys
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

import asyncpg
import httpx

from bench import anti_entropy, ceiling
from bench.stats import latency_summary
from engram_sync.relay.store.minted_keys import create_key
from engram_sync.shared_format.digest import PREFIX_BYTES, SUB_BUCKETS, bucket_of

if TYPE_CHECKING:
    from bench.runner import Run

ROWS_FULL: Final = 100_000
ROWS_QUICK: Final = 10_000
FLOODERS: Final = 12  # issue 31: 12 narrowings at once kept the old gate full
ASKS: Final = 40  # and 37 of these 40 bucket digests were refused
ANSWERED: Final = 0.95  # the target (bench.targets has the same)
_SUBS: Final = base64.b64encode(bytes(SUB_BUCKETS * PREFIX_BYTES)).decode()


async def _vaults(conn: asyncpg.Connection, rows: int) -> tuple[str, str, str, str]:
    """The flood vault (its rows in SQL) and a victim vault of one memory, each with a key
    of its own: (flood vault, its key, victim vault, its key)."""
    flood = await anti_entropy.build_vault(conn, rows)
    victim = "scan-victim-" + secrets.token_hex(4)
    await conn.execute("INSERT INTO vaults (vault_id) VALUES ($1) ON CONFLICT DO NOTHING", victim)
    _, flood_key = await create_key(conn, vault_id=flood, is_admin=False, rate=100_000)
    _, victim_key = await create_key(conn, vault_id=victim, is_admin=False, rate=100_000)
    return flood, flood_key, victim, victim_key


async def _flood(url: str, key: str, vault: str, stop: asyncio.Event, seen: Counter[str]) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    body = {"bucket": bucket_of("ae-0000001"), "subs": _SUBS}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
        while not stop.is_set():
            try:
                answer = await http.post(f"/v1/vaults/{vault}/digest/narrow", json=body)
            except httpx.HTTPError as exc:
                seen[type(exc).__name__] += 1
                continue
            seen[str(answer.status_code)] += 1
            if answer.status_code == 503:
                await asyncio.sleep(0.005)  # a client that honours nothing but a breath


async def _measure(
    url: str, flood: str, flood_key: str, victim: str, victim_key: str, flooders: int, asks: int
) -> dict[str, Any]:
    stop = asyncio.Event()
    flood_seen: Counter[str] = Counter()
    tasks = [
        asyncio.create_task(_flood(url, flood_key, flood, stop, flood_seen))
        for _ in range(flooders)
    ]
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    headers = {"Authorization": f"Bearer {victim_key}"}
    try:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
            while sum(flood_seen.values()) < flooders:  # the flood under way first
                await asyncio.sleep(0.01)
            for n in range(asks):
                started = time.perf_counter()
                answer = await http.get(
                    f"/v1/vaults/{victim}/digest", params={"bucket": n % SUB_BUCKETS}
                )
                latencies.append((time.perf_counter() - started) * 1000)
                statuses[str(answer.status_code)] += 1
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    answered = statuses["200"] / asks
    return {
        "flood_rows": 0,  # set by the caller
        "flooders": flooders,
        "victim_asks": asks,
        "victim_answered": answered,
        "victim_statuses": dict(statuses),
        "victim_latency_ms": latency_summary(latencies, 99),
        "flood_statuses": dict(flood_seen),
    }


def measure_parts(
    loop: asyncio.Runner,
    conn: asyncpg.Connection,
    url: str,
    rows: int,
    *,
    flooders: int = FLOODERS,
    asks: int = ASKS,
) -> dict[str, Any]:
    """The figure against the relay at `url` on the database of `conn`."""
    flood, flood_key, victim, victim_key = loop.run(_vaults(conn, rows))
    result = loop.run(_measure(url, flood, flood_key, victim, victim_key, flooders, asks))
    result["flood_rows"] = rows
    return result


def measure(run: Run) -> dict[str, Any]:
    """Inside `python -m bench` (figure 12): 100,000 rows (10,000 quick)."""
    rows = ROWS_QUICK if run.s.quick else ROWS_FULL
    run.log(f"scan fairness: {FLOODERS} narrowings of {rows:,} rows against {ASKS} digests")
    with run.monitor.phase("scan_fairness"):
        return measure_parts(run.loop, run.conn, run.relay.url, rows)


def verdict(d: dict[str, Any]) -> str:
    """The PASS/FAIL line (bench.targets judges the same in the full report)."""
    answered = d["victim_answered"]
    lat = d["victim_latency_ms"]
    return (
        f"{'PASS' if answered >= ANSWERED else 'FAIL'}: another vault's bucket digests answered "
        f"{answered:.0%} (>= {ANSWERED:.0%}; {d['victim_statuses']}) during {d['flooders']} "
        f"concurrent narrowings of {d['flood_rows']:,} rows by another key (flood answered "
        f"{d['flood_statuses']}); median {lat['median']:.1f} ms, p99 {lat['p99']:.1f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    """The figure alone, on its own embedded PostgreSQL and relay process."""
    from bench.database import BenchDatabase
    from bench.relay_process import RelayProcess

    parser = argparse.ArgumentParser(prog="python -m bench.scan_fairness")
    parser.add_argument("--rows", type=int, default=ROWS_FULL, help="memories of the flood vault")
    parser.add_argument("--flooders", type=int, default=FLOODERS)
    parser.add_argument("--asks", type=int, default=ASKS)
    parser.add_argument("--quick", action="store_true", help=f"{ROWS_QUICK:,} rows")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows = ROWS_QUICK
    with BenchDatabase() as db:
        key = "bench-" + secrets.token_urlsafe(24)
        with (
            RelayProcess(db.url, key, db.scratch / "relay.log") as relay,
            asyncio.Runner() as loop,
        ):
            print(f"relay pid {relay.pid}, flood vault of {args.rows:,} rows", file=sys.stderr)
            conn = loop.run(ceiling.connect(db.url))
            try:
                result = measure_parts(
                    loop, conn, relay.url, args.rows, flooders=args.flooders, asks=args.asks
                )
            finally:
                loop.run(conn.close())
    print(json.dumps(result, indent=2))
    print(verdict(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
