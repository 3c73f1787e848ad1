"""Push throughput with the live change feed on and off (issue 15 "Figures", PROTOCOL §15).

Two relay processes on the run's database, one with `ENGRAM_RELAY_LIVE_FEED=on` (the
default: a NOTIFY after every commit, a LISTEN connection per process) and one with `off`
(no NOTIFY, no LISTEN), and the raw asyncpg ceiling (bench.ceiling). Each round pushes
the same number of blobs, batch by batch like one device (bench.relay_load.push_all),
through the feed-off relay, the feed-on relay and the ceiling, in an order that alternates
from round to round (off/on/ceiling, then on/off/ceiling, ...) so the machine's load hits
both sides alike; every push goes to a new vault. Figures: per round, off / on - 1 (the
feed's cost; the target is <= 3%) and on / ceiling (>= 0.5, as `relay_push_vs_ceiling`).
Nobody subscribes during the rounds: what is measured is what the feed costs a push.

`python -m bench.live_throughput [--quick]` runs this row alone on a scratch database.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import asyncpg
import httpx

from bench import ceiling
from bench.corpus import Corpus
from bench.database import BenchDatabase
from bench.relay_load import headers, push_all, push_bodies
from bench.relay_process import RelayProcess
from bench.settings import PUSH_BATCH, default_workers
from bench.stats import rate, summary

FULL_BLOBS: Final = 20_000  # per side and round
QUICK_BLOBS: Final = 1_000
FULL_ROUNDS: Final = 6
QUICK_ROUNDS: Final = 2
FEED_ENV: Final = "ENGRAM_RELAY_LIVE_FEED"
START_TIMEOUT_S: Final = 180.0  # two workers each, on a loaded machine


@contextlib.contextmanager
def relay_with_feed(
    database_url: str, key: str, log_dir: Path, feed: str, workers: int
) -> Iterator[RelayProcess]:
    """A relay process with ENGRAM_RELAY_LIVE_FEED=`feed` (the child reads the environment)."""
    before = os.environ.get(FEED_ENV)
    os.environ[FEED_ENV] = feed
    try:
        relay = RelayProcess(database_url, key, log_dir / f"relay-feed-{feed}.log", workers=workers)
        relay.start(timeout=START_TIMEOUT_S)
    finally:
        if before is None:
            os.environ.pop(FEED_ENV, None)
        else:
            os.environ[FEED_ENV] = before
    try:
        yield relay
    finally:
        relay.stop()


def _push_round(relay: RelayProcess, corpus: Corpus, tag: str, blobs: int) -> float:
    vault_id = f"feed-tp-{tag}-{secrets.token_hex(3)}"
    bodies = push_bodies(corpus, vault_id, count=blobs, batch=PUSH_BATCH)
    with httpx.Client(
        base_url=relay.url, headers=headers(relay.key, "bench-feed-pusher"), timeout=120.0
    ) as http:
        return rate(blobs, push_all(http, vault_id, bodies))


def measure_on(
    loop: asyncio.Runner,
    conn: asyncpg.Connection,
    corpus: Corpus,
    relays: dict[str, RelayProcess],
    *,
    quick: bool,
) -> dict[str, Any]:
    """The rounds, on relays already running ("on" and "off") and a ceiling connection."""
    blobs = QUICK_BLOBS if quick else FULL_BLOBS
    rounds = QUICK_ROUNDS if quick else FULL_ROUNDS
    if corpus.size < blobs:
        raise ValueError(f"the corpus holds {corpus.size} blobs, the rounds need {blobs}")
    on: list[float] = []
    off: list[float] = []
    top: list[float] = []
    for r in range(-1, rounds):  # round -1 warms both relays up and is not counted
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        got = {side: _push_round(relays[side], corpus, f"{side}{r}", blobs) for side in order}
        prepared = ceiling.prepare(corpus, f"feed-tp-ceiling-{r}", count=blobs, batch=PUSH_BATCH)
        cw = rate(blobs, loop.run(ceiling.write(conn, prepared)))
        if r < 0:
            continue
        on.append(got["on"])
        off.append(got["off"])
        top.append(cw)
    overheads = [f / o - 1 for f, o in zip(off, on, strict=True)]
    to_ceiling = [o / c for o, c in zip(on, top, strict=True)]
    return {
        "blobs_per_round": blobs,
        "batch": PUSH_BATCH,
        "rounds": rounds,
        "on_blobs_per_s": summary(on, "blobs/s"),
        "off_blobs_per_s": summary(off, "blobs/s"),
        "ceiling_blobs_per_s": summary(top, "blobs/s"),
        "overheads": summary(overheads, "x"),
        "overhead": statistics.median(overheads),
        "on_over_off": statistics.median(on) / statistics.median(off),
        "on_ratio_to_ceiling": statistics.median(to_ceiling),
    }


def measure(
    loop: asyncio.Runner,
    conn: asyncpg.Connection,
    corpus: Corpus,
    database_url: str,
    key: str,
    log_dir: Path,
    *,
    workers: int,
    quick: bool,
) -> dict[str, Any]:
    """The report's `live_throughput` section: starts the two relays, runs the rounds."""
    with (
        relay_with_feed(database_url, key, log_dir, "on", workers) as on,
        relay_with_feed(database_url, key, log_dir, "off", workers) as off,
    ):
        return measure_on(loop, conn, corpus, {"on": on, "off": off}, quick=quick)


def main(argv: list[str] | None = None) -> int:
    """This row alone on a scratch database; prints the section and the verdicts."""
    from bench.targets import live_throughput_targets

    parser = argparse.ArgumentParser(prog="python -m bench.live_throughput")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workers", type=int, default=default_workers())
    args = parser.parse_args(argv)
    corpus = Corpus.make(QUICK_BLOBS if args.quick else FULL_BLOBS)
    key = "bench-" + secrets.token_urlsafe(24)
    with BenchDatabase() as db, asyncio.Runner() as loop:
        conn = loop.run(ceiling.connect(db.url))
        try:
            section = measure(
                loop, conn, corpus, db.url, key, db.scratch, workers=args.workers,
                quick=args.quick,
            )  # fmt: skip
        finally:
            loop.run(conn.close())
    print(json.dumps(section, indent=2))
    for target in live_throughput_targets(section):
        t = target.as_json()
        print(f"{t['verdict']}  {t['name']}: {t['value']:.4f} (target {t['target']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
