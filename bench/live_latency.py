"""Live sync latency (issue 15 "Figures", PROTOCOL §15): from device A's push starting to
the memory being applied in device B's vault, B connected by the event stream through the
real client, under a background of connected devices and pushes.

- Background (bench.live_background, its own process): `devices` feed-only devices over
  `vaults` vaults (event stream + a real cursor pull on each hint) and `rate` pushes/s.
- Measured: `pairs` pairs of real client devices (SQLCipher vaults, real keys), each pair
  on a vault of its own, each B in a process of its own (bench.live_receiver; the As are
  threads here, each waiting on its B between pushes). B runs the live sync behind
  `Vault.watch` / `engram-sync watch`
  (client._flows.live.LiveSync with its default timing and feed; the timer set to an hour,
  so only the feed makes it sync). A adds a memory locally, then its real push
  (`Syncer.push`: encode, pad, seal, POST) starts the clock; the clock stops when B's
  pull has applied and committed the page holding that memory (the page's transaction
  in engrams.db ended, before the cursor's save: `Syncer._apply_page` returned, on B's
  sync thread, which then reads the memory back). B's
  whole sync report comes later (the push phase and the digest check of that sync), and
  is reported beside it.
- One push per pair at a time, the next one `GAP_S` after B applied the last: the live
  loop never starts two syncs within 0.5 s (client._flows.live.LiveTiming.min_sync_gap_s),
  and that floor is not what is measured here.

`python -m bench.live_latency [--quick]` runs this row alone on a scratch database and
relay; `python -m bench` runs it as part of the whole report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from bench.child_process import end_child
from bench.database import BenchDatabase
from bench.live_receiver import PASSPHRASE
from bench.relay_load import BenchError
from bench.relay_process import ROOT, RelayProcess
from bench.settings import default_workers
from bench.stats import percentile
from engram_sync.client._errors import SyncError
from engram_sync.client._session import VaultSession
from engram_sync.client._sync.reports import SyncReport
from engram_sync.client._vault import store as local_store

GAP_S: Final = 0.6  # between B applying one memory and A's next push (> min_sync_gap_s)
APPLY_TIMEOUT_S: Final = 30.0  # a memory not applied by then counts as lost (an error)


@dataclass(frozen=True)
class Size:
    """How big one run of the row is."""

    devices: int
    vaults: int
    rate: float
    pairs: int
    seconds: float

    @classmethod
    def of(cls, *, quick: bool) -> Size:
        if quick:
            return cls(devices=50, vaults=10, rate=10.0, pairs=1, seconds=4.0)
        return cls(devices=1_000, vaults=100, rate=100.0, pairs=4, seconds=60.0)


@dataclass
class PairResult:
    """One pair's latencies (ms)."""

    applied_ms: list[float] = field(default_factory=list)
    report_ms: list[float] = field(default_factory=list)
    push_ms: list[float] = field(default_factory=list)  # A's push alone, to its answer
    hint_ms: list[float] = field(default_factory=list)  # to the change hint at B
    sync_ms: list[float] = field(default_factory=list)  # to B's sync starting
    saved_ms: list[float] = field(default_factory=list)  # to B's cursor saved after it
    errors: list[str] = field(default_factory=list)


class _Receiver:
    """Device B in its own process (bench.live_receiver): tells when a memory is applied."""

    def __init__(self, directory: Path, relay_url: str, key: str, vault_id: str) -> None:
        self._proc = subprocess.Popen(  # noqa: S603 - our own module
            [sys.executable, "-m", "bench.live_receiver", str(directory), relay_url, key,
             vault_id],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.connected = threading.Event()
        self.applied = threading.Event()
        self.reported = threading.Event()
        self.applied_at = self.hinted_at = self.synced_at = self.reported_at = 0.0
        self.saved_at = 0.0
        self.failure: str | None = None
        self._expecting = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._read, name="bench-receiver", daemon=True)

    def start(self) -> _Receiver:
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            word, *values = line.split()
            if word == "connected":
                self.connected.set()
            elif word == "expecting":
                self._expecting.set()
            elif word == "applied":
                self.applied_at, self.hinted_at, self.synced_at = map(float, values)
                self.applied.set()
            elif word == "saved":
                self.saved_at = float(values[0])
            elif word == "reported":
                self.reported_at = float(values[0])
                self.reported.set()
            elif word == "failed":
                self.failure = line[len("failed ") :].strip()
        if self.failure is None and not self._closing:
            self.failure = f"device B's process ended (exit {self._proc.wait()})"
        self.connected.set()
        self._expecting.set()

    def expect(self, memory_id: str) -> None:
        """Watch for `memory_id`; returns once B has taken it (before the push starts)."""
        self.applied.clear()
        self.reported.clear()
        self._expecting.clear()
        self.saved_at = 0.0
        assert self._proc.stdin is not None
        self._proc.stdin.write(f"expect {memory_id}\n")
        self._proc.stdin.flush()
        self._expecting.wait(APPLY_TIMEOUT_S)

    def close(self) -> None:
        self._closing = True
        end_child(self._proc, self._thread, wait_s=30)


def _pair(
    base: Path, relay_url: str, key: str, index: int, seconds: float, ready: threading.Barrier
) -> PairResult:
    """One pair's measurements for `seconds` once every pair is ready."""
    vault_id = f"live-{secrets.token_hex(4)}-{index}"
    result = PairResult()
    watcher = _Receiver(base / f"{vault_id}-b", relay_url, key, vault_id).start()
    try:
        with VaultSession.open(base / f"{vault_id}-a", PASSPHRASE, create=True) as a:
            a.link(relay_url, key, vault_id, "bench-live-a")
            _ = a.keys
            watcher.connected.wait(120)
            if watcher.failure is not None:
                raise BenchError(f"device B failed: {watcher.failure}")
            if not watcher.connected.is_set():
                raise BenchError("device B never connected to the event stream")
            ready.wait(300)
            until = time.monotonic() + seconds
            with a.relay() as relay:
                syncer = a.syncer(relay)
                n = 0
                while time.monotonic() < until:
                    memory_id = local_store.add_memory(a.vault.conn, f"live memory {index}.{n}")
                    n += 1
                    watcher.expect(str(memory_id))
                    started = time.monotonic()
                    report = SyncReport()
                    try:
                        syncer.push(report)
                    except SyncError as exc:
                        result.errors.append(f"push: {exc}"[:200])
                        continue
                    result.push_ms.append((time.monotonic() - started) * 1000)
                    if report.pushed != 1:
                        result.errors.append(f"push sent {report.pushed} memories, not 1")
                    if not watcher.applied.wait(APPLY_TIMEOUT_S):
                        result.errors.append(f"memory {memory_id} not applied on B in time")
                        continue
                    result.applied_ms.append((watcher.applied_at - started) * 1000)
                    if watcher.hinted_at:
                        result.hint_ms.append((watcher.hinted_at - started) * 1000)
                    if watcher.synced_at:
                        result.sync_ms.append((watcher.synced_at - started) * 1000)
                    if watcher.reported.wait(APPLY_TIMEOUT_S):
                        result.report_ms.append((watcher.reported_at - started) * 1000)
                    if watcher.saved_at:  # said before the report
                        result.saved_ms.append((watcher.saved_at - started) * 1000)
                    time.sleep(GAP_S)
    finally:
        watcher.close()
    if watcher.failure is not None:
        result.errors.append(f"device B: {watcher.failure}"[:200])
    return result


@contextlib.contextmanager
def background(
    relay_url: str, key: str, size: Size, *, plain: bool = False
) -> Iterator[dict[str, Any]]:
    """The background load process, connected and pushing; its counts land in the dict
    yielded once the block is left. `plain`: its streams without `blobs=1`."""
    counts: dict[str, Any] = {}
    proc = subprocess.Popen(  # noqa: S603 - our own module
        [sys.executable, "-m", "bench.live_background", relay_url, key,
         str(size.devices), str(size.vaults), str(size.rate), *(["plain"] if plain else [])],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    stdin: IO[str] | None = proc.stdin
    try:
        assert proc.stdout is not None
        assert stdin is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise BenchError(f"the background load did not start (said {line!r})")
        yield counts
        stdin.close()
        stdin = None
        last = proc.stdout.readline()
        counts.update(json.loads(last))
        proc.wait(timeout=60)
    finally:
        if stdin is not None:
            stdin.close()
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


def measure(
    relay_url: str, key: str, scratch: Path, *, quick: bool, plain_background: bool = False
) -> dict[str, Any]:
    """The report's `live_latency` section (`plain_background`: the background devices
    pull on every hint, as before `events-blobs`; for a comparison, not the report)."""
    size = Size.of(quick=quick)
    base = Path(tempfile.mkdtemp(prefix="live-latency-", dir=scratch))
    results: list[PairResult] = [PairResult() for _ in range(size.pairs)]
    try:
        with background(relay_url, key, size, plain=plain_background) as counts:
            ready = threading.Barrier(size.pairs)

            def pair(i: int) -> None:
                try:
                    results[i] = _pair(base, relay_url, key, i, size.seconds, ready)
                except (BenchError, SyncError, threading.BrokenBarrierError) as exc:
                    ready.abort()
                    results[i].errors.append(f"{type(exc).__name__}: {exc}"[:200])

            threads = [threading.Thread(target=pair, args=(i,)) for i in range(size.pairs)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    applied = sorted(ms for r in results for ms in r.applied_ms)
    reported = sorted(ms for r in results for ms in r.report_ms)
    pushed = sorted(ms for r in results for ms in r.push_ms)
    hinted = sorted(ms for r in results for ms in r.hint_ms)
    syncing = sorted(ms for r in results for ms in r.sync_ms)
    saved = sorted(ms for r in results for ms in r.saved_ms)
    errors = [e for r in results for e in r.errors]
    if not applied:
        raise BenchError(f"no live sync latency measured: {errors[:3]}")
    return {
        "background_devices": size.devices,
        "vaults": size.vaults,
        "target_pushes_per_s": size.rate,
        "pairs": size.pairs,
        "samples": len(applied),
        "applied_p50_ms": percentile(applied, 50),
        "applied_p90_ms": percentile(applied, 90),
        "applied_p99_ms": percentile(applied, 99),
        "applied_max_ms": applied[-1],
        "push_p50_ms": percentile(pushed, 50),
        "push_p99_ms": percentile(pushed, 99),
        # where the rest goes: push start to B's feed thread having the hint, and to B's
        # sync starting (the applied figure minus this is B's pull or feed page and apply)
        "hint_p50_ms": percentile(hinted, 50) if hinted else None,
        "sync_start_p50_ms": percentile(syncing, 50) if syncing else None,
        # and to the cursor's save after the page (where the clock stopped before):
        "cursor_saved_p50_ms": percentile(saved, 50) if saved else None,
        "cursor_saved_p99_ms": percentile(saved, 99) if saved else None,
        "report_p50_ms": percentile(reported, 50) if reported else None,
        "report_p99_ms": percentile(reported, 99) if reported else None,
        "errors": len(errors),
        "error_samples": errors[:5],
        "background": counts,
    }


def main(argv: list[str] | None = None) -> int:
    """This row alone, on a scratch database and relay; prints the section and verdicts."""
    from bench.targets import live_latency_targets

    parser = argparse.ArgumentParser(prog="python -m bench.live_latency")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--plain-background", action="store_true")
    args = parser.parse_args(argv)
    key = "bench-" + secrets.token_urlsafe(24)
    with BenchDatabase() as db:
        relay = RelayProcess(db.url, key, db.scratch / "relay.log", workers=args.workers)
        relay.start(timeout=180.0)  # a loaded machine starts workers slowly
        try:
            section = measure(
                relay.url, key, db.scratch, quick=args.quick, plain_background=args.plain_background
            )
        finally:
            relay.stop()
    print(json.dumps(section, indent=2))
    for target in live_latency_targets(section):
        t = target.as_json()
        print(f"{t['verdict']}  {t['name']}: {t['value']:.2f} (target {t['target']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
