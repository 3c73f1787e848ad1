"""The figures of the local history (issue 35 "Figures"; docs/history.md), four rows of one
run, each with its PASS/FAIL (bench.targets.history_targets judges the same):

1. `history_revert_10k`: a real relay process and three real devices A, B and C
   (SQLCipher vaults, real keys) holding the same N memories (10,000: imported into A,
   synced; B and C pull them). B and C watch (the live sync of `Vault.watch`, each in a
   process of its own: bench.history_watcher). A deletes all N (client._vault.local_writes
   .delete, the path of `Vault.delete`, 1,000 per transaction) and syncs; the row waits
   until B and C have applied every deletion. Then B's watch is stopped and A's started
   (the two watching devices of the revert are A and C), and on B `Vault.revert(device=A,
   since=T)` and `Vault.sync()` run (T: a moment between A's import and A's deletions; A
   also wrote the memories' first versions, so without `since` a revert of A's writes
   takes them away for good, as docs/history.md says). Measured: from the revert's start
   to the moment both watching devices hold all N again (each after a committed page),
   and, inside it, the revert's own time and B's sync. Target <= 10 s. B's vault is opened
   and its keys derived before the clock starts (once per process, not the revert's).
2. `history_edit_overhead`: a local edit with history (client._vault.local_writes.edit,
   the path the CLI and `Vault.edit` take) against the same edit without it
   (client._vault.store.edit_memory alone), each in a transaction of its own as a command
   runs it, on a vault of N memories, interleaved (which leg goes first alternates), each
   leg on its own half of the memories. Median per edit, with / without; target <= 1.10.
   The medians of the work inside the transaction (its COMMIT apart) are reported too.
3. `history_pull_overhead`: a pull+apply (`Syncer.sync`, the relay's real pages) of N new
   versions of memories the device holds (so every blob replaces a version and keeps
   one), with history against without. Two devices hold the same N memories; a third one
   rewrites all N and pushes them each round; the two then sync, in alternating order.
   The "without" leg runs the very same engine with `Syncer._keep_replaced` replaced by a
   no-op on its syncer, for that leg only (nothing else differs). Median of the rounds'
   sync times, with / without; target <= 1.15 (the apply's own share is reported too).
4. `history_storage_cap`: E edits (100,000) of M memories (1,000) through local_writes
   .edit, 1,000 per transaction; at the end the capped history's bytes
   (`history.capped_bytes`) <= the cap (`history.cap_bytes`), and the running total equals
   the sum of the kept rows' sizes. Reported: both, the rows kept, the edits' time.

`python -m bench.history [--quick] [--memories N] [--edits E]` runs them alone on an
embedded PostgreSQL and a relay process of their own; `python -m bench` runs them on its
relay as part of the whole report.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import secrets
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Final

from bench.child_process import end_child
from bench.history_watcher import PASSPHRASE
from bench.import_jsonl import write_jsonl
from bench.relay_load import BenchError
from bench.relay_process import ROOT
from engram_sync.client._api import Vault
from engram_sync.client._session import VaultSession
from engram_sync.client._sync.engine import Syncer
from engram_sync.client._sync.reports import SyncReport
from engram_sync.client._vault import history, local_writes, store
from engram_sync.client._vault.transfer import Importer, jsonl_items

WRITE_BATCH: Final = 1_000  # local deletions or edits per transaction
WAIT_S: Final = 300.0  # a watching device not there by then is a failure


@dataclass(frozen=True)
class Size:
    """How big one run is."""

    memories: int  # N of rows 1-3
    edit_rounds: int  # interleaved edit pairs of row 2
    pull_rounds: int  # rounds of row 3
    cap_memories: int  # M of row 4
    cap_edits: int  # E of row 4

    @classmethod
    def of(cls, *, quick: bool) -> Size:
        if quick:
            return cls(memories=500, edit_rounds=200, pull_rounds=3, cap_memories=100,
                       cap_edits=5_000)  # fmt: skip
        return cls(memories=10_000, edit_rounds=2_000, pull_rounds=5, cap_memories=1_000,
                   cap_edits=100_000)  # fmt: skip


# -- devices -----------------------------------------------------------------------------------


def _new_device(directory: Path, source: Path | None) -> VaultSession:
    """A fresh SQLCipher vault (its keys derived), with the memories of `source` imported."""
    session = VaultSession.open(directory, PASSPHRASE, create=True)
    if source is not None:
        with source.open("rb") as handle:
            Importer(session.vault.conn).feed_all(jsonl_items(handle))
    return session


def _linked(
    directory: Path, relay_url: str, key: str, vault_id: str, label: str, source: Path | None
) -> tuple[VaultSession, SyncReport]:
    session = _new_device(directory, source)
    session.link(relay_url, key, vault_id, label)
    with session.relay() as relay:
        return session, session.syncer(relay).sync()


def _ids(session: VaultSession) -> list[str]:
    return [str(row[0]) for row in session.vault.conn.execute("SELECT id FROM engrams ORDER BY id")]


class _Watcher:
    """A watching device in its own process (bench.history_watcher)."""

    def __init__(self, directory: Path, name: str) -> None:
        self.name = name
        self._proc = subprocess.Popen(  # noqa: S603 - our own module
            [sys.executable, "-m", "bench.history_watcher", str(directory)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.connected = threading.Event()
        self._changed = threading.Condition()
        self.held: tuple[float, int] | None = None  # (monotonic time, memories) of the last page
        self.failure: str | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._read, name=f"bench-{name}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        out: IO[str] | None = self._proc.stdout
        assert out is not None
        for line in out:
            word, *values = line.split()
            if word == "connected":
                self.connected.set()
            elif word == "held":
                with self._changed:
                    self.held = (float(values[0]), int(values[1]))
                    self._changed.notify_all()
            elif word == "failed":
                self.failure = line[len("failed ") :].strip()
        if self.failure is None and not self._closing:
            self.failure = f"device {self.name}'s process ended (exit {self._proc.wait()})"
        self.connected.set()
        with self._changed:
            self._changed.notify_all()

    def wait_connected(self) -> None:
        if not self.connected.wait(WAIT_S) or self.failure is not None:
            raise BenchError(f"device {self.name} did not connect: {self.failure}")

    def wait_holding(self, count: int) -> float:
        """The monotonic time of the page after which the device held `count` memories."""
        deadline = time.monotonic() + WAIT_S
        with self._changed:
            while self.held is None or self.held[1] != count:
                if self.failure is not None:
                    raise BenchError(f"device {self.name} failed: {self.failure}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"device {self.name} holds {self.held}, not {count}")
                self._changed.wait(min(left, 1.0))
            return self.held[0]

    def close(self) -> None:
        self._closing = True
        end_child(self._proc, self._thread, wait_s=60)


@contextlib.contextmanager
def _watching(directory: Path, name: str) -> Iterator[_Watcher]:
    watcher = _Watcher(directory, name)
    try:
        watcher.wait_connected()
        yield watcher
    finally:
        watcher.close()


# -- 1: revert ---------------------------------------------------------------------------------


def measure_revert(scratch: Path, relay_url: str, key: str, memories: int) -> dict[str, Any]:
    """Row 1 (see the module docstring)."""
    base = scratch / "history-revert"
    base.mkdir(parents=True, exist_ok=True)
    source = base / "memories.jsonl"
    write_jsonl(source, memories, seed=3510)
    vault_id = f"history-bench-{secrets.token_hex(4)}"
    dirs = {name: base / name for name in "abc"}
    a, first = _linked(dirs["a"], relay_url, key, vault_id, "bench-a", source)
    a_id = a.device.device_id
    for name in "bc":
        session, report = _linked(dirs[name], relay_url, key, vault_id, f"bench-{name}", None)
        session.close()
        if report.applied != memories:
            raise BenchError(f"device {name} applied {report.applied} of {memories}")
    time.sleep(0.05)
    since = datetime.now(UTC)  # after the first versions, before the deletions
    time.sleep(0.05)
    with _watching(dirs["b"], "B") as b_watch, _watching(dirs["c"], "C") as c_watch:
        started = time.perf_counter()
        ids = _ids(a)
        writer = a.writer()
        for start in range(0, len(ids), WRITE_BATCH):
            with a.vault.transaction() as conn:
                for memory_id in ids[start : start + WRITE_BATCH]:
                    local_writes.delete(conn, memory_id, writer, own_device=a_id)
        delete_s = time.perf_counter() - started
        with a.relay() as relay:
            deletions = a.syncer(relay).sync()
        a.close()
        b_watch.wait_holding(0)
        c_watch.wait_holding(0)
        deleted_everywhere_s = time.perf_counter() - started
        b_watch.close()  # B reverts (in this process); A watches from now on
        with _watching(dirs["a"], "A") as a_watch:
            with Vault.open(dirs["b"], PASSPHRASE) as b:
                _ = b._session.keys  # the one-time key derivation, before the clock
                t0 = time.monotonic()
                plan = b.revert(device=a_id, since=since)
                t1 = time.monotonic()
                pushed = b.sync()
                t2 = time.monotonic()
            back = {w.name: w.wait_holding(memories) - t0 for w in (a_watch, c_watch)}
    return {
        "memories": memories,
        "pushed_first": first.pushed,
        "deleted_by_a": deletions.pushed,
        "delete_s": delete_s,
        "deleted_everywhere_s": deleted_everywhere_s,
        "revert_steps": len(plan.steps),
        "undeleted": plan.count("undelete"),
        "unrevertible": len(plan.unrevertible),
        "revert_s": t1 - t0,
        "sync_s": t2 - t1,
        "pushed_by_revert": pushed.pushed,
        "back_on_s": back,
        "all_back_s": max(back.values()),
        "watching_devices": sorted(back),
    }


# -- 2: edit overhead ------------------------------------------------------------------------


def _timed_edit(session: VaultSession, edit: Callable[[Any], object]) -> tuple[float, float]:
    """(whole transaction, its work before COMMIT) of one edit, in seconds."""
    conn = session.vault.conn
    t0 = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    try:
        edit(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    t1 = time.perf_counter()
    conn.execute("COMMIT")
    t2 = time.perf_counter()
    return t2 - t0, t1 - t0


def measure_edit_overhead(scratch: Path, memories: int, rounds: int) -> dict[str, Any]:
    """Row 2 (see the module docstring)."""
    base = scratch / "history-edit"
    base.mkdir(parents=True, exist_ok=True)
    source = base / "memories.jsonl"
    write_jsonl(source, memories, seed=3520)
    rng = random.Random(3520)  # noqa: S311 - a choice of memories, not a secret
    with _new_device(base / "vault", source) as session:
        ids = _ids(session)
        own = session.device.device_id
        halves = (ids[0::2], ids[1::2])  # with history, without: never the same memory
        whole: dict[bool, list[float]] = {True: [], False: []}
        work: dict[bool, list[float]] = {True: [], False: []}
        for r in range(rounds):
            for with_history in (True, False) if r % 2 == 0 else (False, True):
                memory_id = rng.choice(halves[0 if with_history else 1])
                content = f"edited in round {r}: {rng.random()}"
                if with_history:

                    def edit(conn: Any, m: str = memory_id, c: str = content) -> object:
                        by = session.writer()  # as `Vault.edit` takes it, in the edit
                        return local_writes.edit(conn, m, c, None, by, own_device=own)
                else:

                    def edit(conn: Any, m: str = memory_id, c: str = content) -> object:
                        return store.edit_memory(conn, m, c)

                spent, inside = _timed_edit(session, edit)
                whole[with_history].append(spent)
                work[with_history].append(inside)
        kept = session.vault.conn.execute("SELECT count(*) FROM sync_history").fetchone()[0]
    med = {k: statistics.median(v) for k, v in whole.items()}
    inner = {k: statistics.median(v) for k, v in work.items()}
    return {
        "memories": memories,
        "rounds": rounds,
        "with_ms": med[True] * 1000,
        "without_ms": med[False] * 1000,
        "ratio": med[True] / med[False],
        "work_with_ms": inner[True] * 1000,
        "work_without_ms": inner[False] * 1000,
        "work_ratio": inner[True] / inner[False],
        "history_rows": int(kept),
    }


# -- 3: pull overhead ------------------------------------------------------------------------


def _pull(session: VaultSession, *, keep: bool) -> tuple[float, float, SyncReport]:
    """(sync seconds, seconds inside `_apply_page`, report) of one sync of `session`."""
    applying = 0.0
    with session.relay() as relay:
        syncer: Syncer = session.syncer(relay)
        if not keep:  # the "without" leg: no version kept, for this syncer only
            syncer._keep_replaced = lambda *args: None  # type: ignore[method-assign]
        real_apply = syncer._apply_page

        def timed_apply(*args: Any, **kwargs: Any) -> int:
            nonlocal applying
            t = time.perf_counter()
            try:
                return real_apply(*args, **kwargs)
            finally:
                applying += time.perf_counter() - t

        syncer._apply_page = timed_apply  # type: ignore[method-assign]
        started = time.perf_counter()
        report = syncer.sync()
        return time.perf_counter() - started, applying, report


def measure_pull_overhead(
    scratch: Path, relay_url: str, key: str, memories: int, rounds: int
) -> dict[str, Any]:
    """Row 3 (see the module docstring)."""
    base = scratch / "history-pull"
    base.mkdir(parents=True, exist_ok=True)
    source = base / "memories.jsonl"
    write_jsonl(source, memories, seed=3530)
    vault_id = f"history-pull-{secrets.token_hex(4)}"
    writer_dev, _ = _linked(base / "writer", relay_url, key, vault_id, "bench-w", source)
    devices: dict[bool, VaultSession] = {}
    try:
        for keep in (True, False):
            devices[keep], _ = _linked(
                base / ("with" if keep else "without"), relay_url, key, vault_id,
                "bench-with" if keep else "bench-without", None,
            )  # fmt: skip
        ids = _ids(writer_dev)
        own = writer_dev.device.device_id
        sync_s: dict[bool, list[float]] = {True: [], False: []}
        apply_s: dict[bool, list[float]] = {True: [], False: []}
        for r in range(rounds):
            writer = writer_dev.writer()
            for start in range(0, len(ids), WRITE_BATCH):
                with writer_dev.vault.transaction() as conn:
                    for memory_id in ids[start : start + WRITE_BATCH]:
                        text = f"round {r} of {memory_id}"
                        local_writes.edit(conn, memory_id, text, None, writer, own_device=own)
            with writer_dev.relay() as relay:
                pushed = writer_dev.syncer(relay).sync().pushed
            if pushed != memories:
                raise BenchError(f"the writer pushed {pushed} of {memories} new versions")
            for keep in (True, False) if r % 2 == 0 else (False, True):
                spent, applying, report = _pull(devices[keep], keep=keep)
                if report.applied != memories:
                    raise BenchError(f"applied {report.applied} of {memories} new versions")
                sync_s[keep].append(spent)
                apply_s[keep].append(applying)
        kept = devices[True].vault.conn.execute("SELECT count(*) FROM sync_history").fetchone()
        none = devices[False].vault.conn.execute("SELECT count(*) FROM sync_history").fetchone()
    finally:
        writer_dev.close()
        for session in devices.values():
            session.close()
    med = {k: statistics.median(v) for k, v in sync_s.items()}
    app = {k: statistics.median(v) for k, v in apply_s.items()}
    return {
        "memories": memories,
        "rounds": rounds,
        "with_s": med[True],
        "without_s": med[False],
        "ratio": med[True] / med[False],
        "apply_with_s": app[True],
        "apply_without_s": app[False],
        "apply_ratio": app[True] / app[False],
        "rounds_with_s": sync_s[True],
        "rounds_without_s": sync_s[False],
        "history_rows_with": int(kept[0]),
        "history_rows_without": int(none[0]),
    }


# -- 4: storage cap --------------------------------------------------------------------------


def measure_storage_cap(scratch: Path, memories: int, edits: int) -> dict[str, Any]:
    """Row 4 (see the module docstring)."""
    base = scratch / "history-cap"
    base.mkdir(parents=True, exist_ok=True)
    source = base / "memories.jsonl"
    write_jsonl(source, memories, seed=3540)
    with _new_device(base / "vault", source) as session:
        ids = _ids(session)
        own = session.device.device_id
        started = time.perf_counter()
        for start in range(0, edits, WRITE_BATCH):
            writer = session.writer()
            with session.vault.transaction() as conn:
                for n in range(start, min(edits, start + WRITE_BATCH)):
                    memory_id = ids[n % len(ids)]
                    text = f"edit {n} of {memory_id}"
                    local_writes.edit(conn, memory_id, text, None, writer, own_device=own)
        edits_s = time.perf_counter() - started
        conn = session.vault.conn
        rows, counted = conn.execute(
            "SELECT count(*), coalesce(sum(CASE WHEN capped = 1 THEN size END), 0)"
            " FROM sync_history"
        ).fetchone()
        return {
            "memories": memories,
            "edits": edits,
            "edits_s": edits_s,
            "edits_per_s": edits / edits_s,
            "history_rows": int(rows),
            "capped_bytes": history.capped_bytes(conn),
            "capped_bytes_counted": int(counted),
            "cap_bytes": history.cap_bytes(conn),
            "vault_bytes": history.vault_bytes(conn),
            "max_percent": history.retention(conn).max_percent,
        }


# -- the whole -----------------------------------------------------------------------------


def measure(
    scratch: Path, relay_url: str, key: str, size: Size, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The four rows, in order."""
    log(f"history: revert of {size.memories:,} deletions, two watching devices")
    revert = measure_revert(scratch, relay_url, key, size.memories)
    log(f"history: edit overhead, {size.edit_rounds:,} interleaved pairs")
    edit = measure_edit_overhead(scratch, size.memories, size.edit_rounds)
    log(f"history: pull overhead, {size.pull_rounds} rounds of {size.memories:,} versions")
    pull = measure_pull_overhead(scratch, relay_url, key, size.memories, size.pull_rounds)
    log(f"history: storage cap, {size.cap_edits:,} edits of {size.cap_memories:,} memories")
    cap = measure_storage_cap(scratch, size.cap_memories, size.cap_edits)
    return {
        "revert": revert,
        "edit_overhead": edit,
        "pull_overhead": pull,
        "storage_cap": cap,
        "load_average_1m": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    """The four rows alone, on their own embedded PostgreSQL and relay process."""
    from bench.alone import run_alone
    from bench.targets import history_targets

    parser = argparse.ArgumentParser(prog="python -m bench.history")
    parser.add_argument("--quick", action="store_true", help="small sizes: a minute or two")
    parser.add_argument("--memories", type=int, help="N of the revert and the overheads")
    parser.add_argument("--edits", type=int, help="E of the storage cap")
    args = parser.parse_args(argv)
    size = Size.of(quick=args.quick)
    if args.memories:
        size = Size(args.memories, size.edit_rounds, size.pull_rounds, size.cap_memories,
                    size.cap_edits)  # fmt: skip
    if args.edits:
        size = Size(size.memories, size.edit_rounds, size.pull_rounds, size.cap_memories,
                    args.edits)  # fmt: skip
    return run_alone(
        lambda scratch, url, key, log: measure(scratch, url, key, size, log), history_targets
    )


if __name__ == "__main__":
    raise SystemExit(main())
