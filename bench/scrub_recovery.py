"""A row the relay lost, back without a manual step (issue 35 part 3; relay.store.scrub,
docs/digest.md "The scrub").

A real device imports M memories (100,000; fewer in the tests) into a SQLCipher vault and
syncs them to a real relay process whose maintenance round runs every second and scrubs
each vault every `scrub_interval_s` seconds (ENGRAM_RELAY_MAINTENANCE_INTERVAL_S=1,
ENGRAM_RELAY_SCRUB_INTERVAL_S). Then one blob row is deleted by hand from the relay's
database (the vault row left claiming it, as a disk fault or a partial restore leaves it)
and nothing else is done but what a device's daemon does: the relay's own rounds, then one
ordinary sync. Measured: from the deletion to the scrub's repair of the stored digest (the
relay noticed), the one sync after it, and whether the row is back on the relay.

Target (`scrub_lost_row_back`): the row back, after exactly that one sync, within one scrub
interval plus one wait between rounds plus two rounds (the worst case: the round that
starts just before the vault is due, then the one that scrubs it; a round's length is
timed after, on the same vault: its sweep and its scrub) plus the one sync, in seconds.

`python -m bench.scrub_recovery [--memories M] [--scrub-interval S]` runs it alone on its
own embedded PostgreSQL and relay process; prints the JSON and the PASS/FAIL line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import asyncpg

from bench.import_jsonl import write_jsonl
from engram_sync.client._session import VaultSession
from engram_sync.client._vault.transfer import Importer, jsonl_items
from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.services.maintenance import sweep
from engram_sync.relay.store.scrub import scrub_vault

FULL_MEMORIES: Final = 100_000
ROUND_S: Final = 1  # ENGRAM_RELAY_MAINTENANCE_INTERVAL_S of the bench's relay
SCRUB_INTERVAL_S: Final = 10  # ENGRAM_RELAY_SCRUB_INTERVAL_S of the bench's relay
PASSPHRASE: Final = "engram bench scrub: correct horse battery staple"  # noqa: S105


def relay_env(scrub_interval_s: int) -> dict[str, str]:
    """The environment of the bench's relay process: rounds every second, the scrub's
    interval as asked."""
    return {
        "ENGRAM_RELAY_MAINTENANCE_INTERVAL_S": str(ROUND_S),
        "ENGRAM_RELAY_SCRUB_INTERVAL_S": str(scrub_interval_s),
    }


async def _sql(database_url: str, query: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(to_libpq_url(database_url))
    try:
        rows: list[asyncpg.Record] = await conn.fetch(query, *args)
        return rows
    finally:
        await conn.close()


def _mismatches(database_url: str, vault_id: str) -> int:
    rows = asyncio.run(
        _sql(database_url, "SELECT scrub_mismatches FROM vaults WHERE vault_id = $1", vault_id)
    )
    return int(rows[0]["scrub_mismatches"]) if rows else 0


async def _round_s(database_url: str, vault_id: str) -> float:
    """Seconds of one maintenance round's work on this database: its sweep, then the
    scrub of the vault (what the relay's round runs, here without its lock)."""
    conn = await asyncpg.connect(to_libpq_url(database_url))
    try:
        started = time.perf_counter()
        await sweep(conn, timedelta(days=30))
        await scrub_vault(conn, vault_id, 600_000)
        return time.perf_counter() - started
    finally:
        await conn.close()


def measure(
    scratch: Path,
    relay_url: str,
    api_key: str,
    database_url: str,
    memories: int,
    scrub_interval_s: int,
) -> dict[str, Any]:
    """One lost row and its way back (see the module docstring); the relay at `relay_url`
    must run with `relay_env(scrub_interval_s)`."""
    source = scratch / "scrub-bench.jsonl"
    write_jsonl(source, memories, seed=35)
    vault_id = f"scrub-bench-{secrets.token_hex(4)}"
    with VaultSession.open(scratch / "scrub-bench-vault", PASSPHRASE, create=True) as session:
        with source.open("rb") as handle:
            Importer(session.vault.conn).feed_all(jsonl_items(handle))
        session.link(relay_url, api_key, vault_id, "bench")
        with session.relay() as relay:
            first = session.syncer(relay).sync()
        lost = str(session.vault.conn.execute("SELECT id FROM engrams LIMIT 1").fetchone()[0])
        before = _mismatches(database_url, vault_id)
        gone = asyncio.run(
            _sql(
                database_url,
                "DELETE FROM blobs WHERE vault_id = $1 AND memory_id = $2 RETURNING 1",
                vault_id,
                lost,
            )
        )
        deleted_at = time.perf_counter()
        bound = scrub_interval_s + ROUND_S + 120.0  # a margin for a slow machine
        while _mismatches(database_url, vault_id) == before:
            if time.perf_counter() - deleted_at > bound:
                break
            time.sleep(0.1)
        noticed_s = time.perf_counter() - deleted_at
        noticed = _mismatches(database_url, vault_id) > before
        started = time.perf_counter()
        with session.relay() as relay:
            report = session.syncer(relay).sync()  # the one ordinary sync
        sync_s = time.perf_counter() - started
    back = bool(
        asyncio.run(
            _sql(
                database_url,
                "SELECT 1 FROM blobs WHERE vault_id = $1 AND memory_id = $2",
                vault_id,
                lost,
            )
        )
    )
    round_s = asyncio.run(_round_s(database_url, vault_id))
    return {
        "memories": memories,
        "pushed_first": first.pushed,
        "row_deleted": len(gone) == 1,
        "scrub_interval_s": scrub_interval_s,
        "maintenance_interval_s": ROUND_S,
        "noticed": noticed,
        "noticed_s": noticed_s,
        "sync_s": sync_s,
        "syncs_after": 1,
        "pushed_again": report.pushed,
        "back": back,
        "round_s": round_s,
        "total_s": noticed_s + sync_s,
        "limit_s": scrub_interval_s + ROUND_S + 2 * round_s + sync_s,
    }


def verdict(d: dict[str, Any]) -> str:
    """The PASS/FAIL line (bench.targets judges the same)."""
    ok = d["back"] and d["noticed"] and d["total_s"] <= d["limit_s"]
    return (
        f"{'PASS' if ok else 'FAIL'}: one blob row deleted by hand from a {d['memories']:,}-memory"
        f" vault {'back' if d['back'] else 'NOT back'} on the relay {d['total_s']:.1f} s later"
        f" (<= {d['limit_s']:.1f} s: scrub interval {d['scrub_interval_s']} s + wait"
        f" {d['maintenance_interval_s']} s + 2 rounds of {d['round_s']:.2f} s + one sync"
        f" {d['sync_s']:.1f} s), no manual step: the scrub noticed after"
        f" {d['noticed_s']:.1f} s, the next sync pushed {d['pushed_again']} again"
    )


def main(argv: list[str] | None = None) -> int:
    """The figure alone, on its own embedded PostgreSQL and relay process."""
    from bench.database import BenchDatabase
    from bench.relay_process import RelayProcess

    parser = argparse.ArgumentParser(prog="python -m bench.scrub_recovery")
    parser.add_argument("--memories", type=int, default=FULL_MEMORIES)
    parser.add_argument("--scrub-interval", type=int, default=SCRUB_INTERVAL_S)
    args = parser.parse_args(argv)
    os.environ.update(relay_env(args.scrub_interval))  # the relay process inherits them
    with BenchDatabase() as db:
        key = "bench-" + secrets.token_urlsafe(24)
        with RelayProcess(db.url, key, db.scratch / "relay.log") as relay:
            print(f"relay pid {relay.pid}, {args.memories:,} memories", file=sys.stderr)
            result = measure(
                db.scratch, relay.url, relay.key, db.url, args.memories, args.scrub_interval
            )
    print(json.dumps(result, indent=2))
    print(verdict(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
