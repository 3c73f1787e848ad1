"""The figures of `engram-sync mcp` (issue 33 "Figures"; docs/mcp.md), three rows of one
run, each with its PASS/FAIL (bench.targets.mcp_targets judges the same):

1. `mcp_remember_to_recall`: a real relay process and two real devices A and B (SQLCipher
   vaults, real keys, linked to one vault on the relay), each running `engram-sync mcp`
   (a subprocess over stdio, live sync on, keys from ENGRAM_PASSPHRASE), both driven by
   the real `mcp` client from this process (one clock). For each of N memories (200): A's
   `remember` returns, then B's `recall` of the memory's one unusual word is called again
   and again (a call every `POLL_S`) until it finds the memory; measured from A's answer
   to B's first answer holding it. The next memory follows `GAP_S` after that: the live
   loop never starts two syncs within 0.5 s (client._flows.live.LiveTiming
   .min_sync_gap_s), and that floor is not what is measured. p50 <= 50 ms, p99 <= 250 ms.
2. `mcp_recall_100k`: a vault of M memories (100,000; the corpus of bench.import_jsonl,
   imported through client._vault.transfer.Importer, the path of `engram-sync import`),
   served by the tools in-process (`build_server` over `VaultAccess`, the real `mcp`
   client in memory: the tool call's round trip without a pipe). Q `recall` calls (1,000),
   each two words (of four letters or more) of a memory of the vault, limit 10: the
   corpus has some seventy words, so a query matches thousands of memories (about 3,400
   of 100,000 on average) and the rank decides. p95 <= 20 ms.
3. `mcp_remember_throughput`: R `remember` calls (5,000) through A's stdio server (linked,
   live on: its loop pushes meanwhile), `IN_FLIGHT` calls in flight from one client;
   memories per second, >= 500. The same calls one at a time (R / 5 of them) are
   reported beside it.

The machine's load average is reported with each row: the figures are of a shared
machine.

`python -m bench.mcp [--quick]` runs the rows alone on an embedded PostgreSQL and a relay
process of their own; `python -m bench` runs them on its relay as part of the whole report.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp_types import Implementation

from bench.import_jsonl import write_jsonl
from bench.relay_load import BenchError
from bench.stats import percentile
from engram_sync.client._mcp.access import VaultAccess
from engram_sync.client._mcp.server import build_server
from engram_sync.client._session import VaultSession
from engram_sync.client._vault.transfer import Importer, jsonl_items

PASSPHRASE: Final = "engram bench mcp: correct horse battery staple"  # noqa: S105
EXE: Final = str(Path(sys.executable).parent / "engram-sync")
GAP_S: Final = 0.6  # between B finding one memory and A's next remember (> min_sync_gap_s)
POLL_S: Final = 0.002  # between two of B's recalls while it waits
FOUND_TIMEOUT_S: Final = 30.0  # a memory B has not found by then: the row fails
LIVE_TIMEOUT_S: Final = 60.0  # both servers syncing live by then, or the run fails
IN_FLIGHT: Final = 8  # row 3: calls in flight from the one client
WARM_UP: Final = 20  # calls before a row's clock starts


@dataclass(frozen=True)
class Size:
    """How big one run is."""

    memories: int  # N of row 1
    vault: int  # M of row 2
    recalls: int  # Q of row 2
    remembers: int  # R of row 3

    @classmethod
    def of(cls, *, quick: bool) -> Size:
        if quick:
            return cls(memories=10, vault=2_000, recalls=100, remembers=500)
        return cls(memories=200, vault=100_000, recalls=1_000, remembers=5_000)


# -- devices and servers -----------------------------------------------------------------------


def _linked_device(directory: Path, relay_url: str, key: str, vault_id: str, label: str) -> None:
    with VaultSession.open(directory, PASSPHRASE, create=True) as session:
        session.link(relay_url, key, vault_id, label)


@asynccontextmanager
async def _stdio_server(directory: Path, name: str, errlog: TextIO) -> AsyncIterator[Client]:
    """`engram-sync mcp` on the vault in `directory`, live sync on, as an AI client starts
    it; the client names itself `name`."""
    home = directory.parent / f"{directory.name}-home"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_RUNTIME_DIR": str(home / "run"),  # no unlock agent: ENGRAM_PASSPHRASE opens it
        "ENGRAM_PASSPHRASE": PASSPHRASE,
    }
    params = StdioServerParameters(command=EXE, args=["--vault", str(directory), "mcp"], env=env)
    transport = stdio_client(params, errlog=errlog)
    info = Implementation(name=name, version="1")
    async with Client(transport, client_info=info, read_timeout_seconds=120) as client:
        yield client


async def _call(client: Client, tool: str, **arguments: Any) -> Any:
    result = await client.call_tool(tool, arguments)
    if result.is_error:
        raise BenchError(f"{tool} refused: {result.content}")
    return json.loads(result.content[0].text)  # type: ignore[union-attr]


async def _until_live(client: Client, what: str) -> None:
    deadline = time.monotonic() + LIVE_TIMEOUT_S
    while (await _call(client, "sync_status"))["live_state"] != "connected":
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: not syncing live within {LIVE_TIMEOUT_S:g} s")
        await anyio.sleep(0.05)


# -- row 1: remember on A -> recall on B ---------------------------------------------------------


async def _remember_to_recall(a: Client, b: Client, memories: int) -> dict[str, Any]:
    run = secrets.token_hex(3)
    latencies: list[float] = []
    polls = 0
    for index in range(memories):
        word = f"mcpbench{run}n{index}"  # one unusual word: B's recall finds this memory only
        content = f"Decision {index}: the relay moves to the new host ({word})."
        answer = await _call(a, "remember", content=content, tags=["bench"])
        returned = time.perf_counter()
        while True:
            polls += 1
            found = await _call(b, "recall", query=word, limit=1)
            if [m["id"] for m in found["memories"]] == [answer["id"]]:
                latencies.append((time.perf_counter() - returned) * 1000)
                break
            if time.perf_counter() - returned > FOUND_TIMEOUT_S:
                raise BenchError(f"memory {index} not recalled on B within {FOUND_TIMEOUT_S} s")
            await anyio.sleep(POLL_S)
        await anyio.sleep(GAP_S)
    ordered = sorted(latencies)
    return {
        "memories": memories,
        "p50_ms": percentile(ordered, 50),
        "p90_ms": percentile(ordered, 90),
        "p99_ms": percentile(ordered, 99),
        "max_ms": ordered[-1],
        "min_ms": ordered[0],
        "recalls_on_b": polls,
        "gap_s": GAP_S,
        "poll_s": POLL_S,
        "load_average_1m": os.getloadavg()[0],
    }


# -- row 3: remember throughput through stdio ----------------------------------------------------


async def _remember_throughput(a: Client, remembers: int) -> dict[str, Any]:
    run = secrets.token_hex(3)
    for index in range(WARM_UP):
        await _call(a, "remember", content=f"warm-up {run} {index}")
    sequential = max(1, remembers // 5)
    started = time.perf_counter()
    for index in range(sequential):
        await _call(a, "remember", content=f"One at a time {run}: note {index}.")
    one_at_a_time_s = time.perf_counter() - started
    counter = iter(range(remembers))

    async def worker() -> None:
        for index in counter:
            await _call(a, "remember", content=f"In flight {run}: note {index}.", tags=["bench"])

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(IN_FLIGHT):
            group.start_soon(worker)
    in_flight_s = time.perf_counter() - started
    listed = await _call(a, "recall", query=f"flight {run}", limit=1)
    if not listed["memories"]:
        raise BenchError("the remembered memories are not found on A")
    return {
        "remembers": remembers,
        "in_flight": IN_FLIGHT,
        "seconds": in_flight_s,
        "memories_per_s": remembers / in_flight_s,
        "one_at_a_time": sequential,
        "one_at_a_time_s": one_at_a_time_s,
        "one_at_a_time_per_s": sequential / one_at_a_time_s,
        "load_average_1m": os.getloadavg()[0],
    }


async def _two_device_rows(
    scratch: Path, relay_url: str, key: str, size: Size, log: Callable[[str], None]
) -> tuple[dict[str, Any], dict[str, Any]]:
    vault_id = f"mcp-bench-{secrets.token_hex(4)}"
    dirs = {name: scratch / f"mcp-{name}" for name in ("a", "b")}
    for name, directory in dirs.items():
        _linked_device(directory, relay_url, key, vault_id, f"bench-mcp-{name}")
    with (scratch / "mcp-servers.log").open("w", encoding="utf-8") as errlog:
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(_stdio_server(dirs["a"], "bench-on-a", errlog))
            b = await stack.enter_async_context(_stdio_server(dirs["b"], "bench-on-b", errlog))
            await _until_live(a, "A")
            await _until_live(b, "B")
            log(f"mcp: remember on A -> recall on B, {size.memories} memories")
            crossing = await _remember_to_recall(a, b, size.memories)
            log(f"mcp: remember throughput through stdio, {size.remembers:,} calls")
            throughput = await _remember_throughput(a, size.remembers)
    return crossing, throughput


# -- row 2: recall on a large vault ----------------------------------------------------------------


def _large_vault(scratch: Path, memories: int, queries: int) -> tuple[Path, list[str], float]:
    """A vault of `memories` imported memories; `queries` two-word queries from its
    memories; the import's seconds."""
    source = scratch / "mcp-recall.jsonl"
    write_jsonl(source, memories, seed=33)
    directory = scratch / "mcp-recall-vault"
    started = time.perf_counter()
    with VaultSession.open(directory, PASSPHRASE, create=True) as session:
        with source.open("rb") as handle:
            summary = Importer(session.vault.conn).feed_all(jsonl_items(handle))
        if summary.added != memories:
            raise BenchError(f"the import added {summary.added} memories, not {memories}")
        rows = session.vault.conn.execute("SELECT content FROM engrams").fetchall()
    import_s = time.perf_counter() - started
    source.unlink()
    rng = random.Random(33)  # noqa: S311 - choosing queries, not a secret
    texts = [str(row[0]) for row in rng.sample(rows, min(queries, len(rows)))]
    # the sentence only: " (note N)" is there to make each content distinct
    words = [
        [w.strip(".,").lower() for w in text.rsplit(" (note ", 1)[0].split()] for text in texts
    ]
    chosen = [rng.sample([w for w in ws if len(w) > 3] or ws, 2) for ws in words]
    return directory, [" ".join(pair) for pair in chosen], import_s


async def _recall_in_process(directory: Path, queries: list[str]) -> tuple[list[float], int]:
    access = VaultAccess(directory, PASSPHRASE)
    try:
        async with Client(build_server(access)) as client:
            for query in queries[:WARM_UP]:
                await _call(client, "recall", query=query)
            times: list[float] = []
            found = 0
            for query in queries:
                started = time.perf_counter()
                answer = await _call(client, "recall", query=query, limit=10)
                times.append((time.perf_counter() - started) * 1000)
                found += len(answer["memories"])
    finally:
        access.close()
    return times, found


def measure_recall(scratch: Path, size: Size) -> dict[str, Any]:
    directory, queries, import_s = _large_vault(scratch, size.vault, size.recalls)
    times, found = anyio.run(_recall_in_process, directory, queries)
    ordered = sorted(times)
    return {
        "memories": size.vault,
        "recalls": len(queries),
        "import_s": import_s,
        "p50_ms": percentile(ordered, 50),
        "p95_ms": percentile(ordered, 95),
        "p99_ms": percentile(ordered, 99),
        "max_ms": ordered[-1],
        "mean_results": found / len(queries),
        "load_average_1m": os.getloadavg()[0],
    }


# -- the whole -----------------------------------------------------------------------------------


def measure(
    scratch: Path, relay_url: str, key: str, size: Size, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The three rows."""
    scratch.mkdir(parents=True, exist_ok=True)
    crossing, throughput = anyio.run(_two_device_rows, scratch, relay_url, key, size, log)
    log(f"mcp: recall on a {size.vault:,}-memory vault, {size.recalls:,} calls")
    recall = measure_recall(scratch, size)
    return {
        "remember_to_recall": crossing,
        "recall": recall,
        "remember_throughput": throughput,
        "load_average_1m": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    """The three rows alone, on their own embedded PostgreSQL and relay process."""
    from bench.alone import run_alone
    from bench.targets import mcp_targets

    parser = argparse.ArgumentParser(prog="python -m bench.mcp")
    parser.add_argument("--quick", action="store_true", help="small sizes: under a minute")
    args = parser.parse_args(argv)
    size = Size.of(quick=args.quick)
    return run_alone(
        lambda scratch, url, key, log: measure(scratch / "mcp", url, key, size, log), mcp_targets
    )


if __name__ == "__main__":
    raise SystemExit(main())
