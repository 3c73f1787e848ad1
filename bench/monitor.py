"""Relay RSS over time and CPU per phase: the relay, the load generator (this process)
and, when the server is ours, PostgreSQL (the postmaster and its backends)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil

MB = 1024 * 1024


def _cpu_seconds(proc: Any) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def _system_busy_seconds() -> float:
    """CPU seconds every process of the machine used (all cores), since boot."""
    times = psutil.cpu_times()
    idle = float(times.idle) + float(getattr(times, "iowait", 0.0))
    idle += float(getattr(times, "steal", 0.0))
    return float(sum(times)) - idle


def _tree_cpu_seconds(proc: Any) -> float:
    """A server's CPU: its own, its reaped children's, and its live children's."""
    times = proc.cpu_times()
    total = float(times.user + times.system + times.children_user + times.children_system)
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += _cpu_seconds(child)
    return total


@dataclass
class PhaseUsage:
    """Wall and CPU seconds of one phase (summed over its repeats), and the relay's peak RSS."""

    wall_s: float = 0.0
    relay_cpu_s: float = 0.0
    loadgen_cpu_s: float = 0.0
    postgres_cpu_s: float | None = 0.0
    machine_cpu_s: float = 0.0  # every process of the machine
    relay_rss_peak_mb: float = 0.0

    def as_json(self) -> dict[str, float | None]:
        """Seconds, and CPU as cores used on average (CPU seconds / wall seconds)."""
        wall = max(self.wall_s, 1e-9)
        pg = self.postgres_cpu_s
        ours = self.relay_cpu_s + self.loadgen_cpu_s + (pg or 0.0)
        return {
            "wall_s": self.wall_s,
            "relay_cpu_s": self.relay_cpu_s,
            "loadgen_cpu_s": self.loadgen_cpu_s,
            "postgres_cpu_s": pg,
            "relay_cores": self.relay_cpu_s / wall,
            "loadgen_cores": self.loadgen_cpu_s / wall,
            "postgres_cores": None if pg is None else pg / wall,
            # Other processes of the (shared) machine; only meaningful when pg is known.
            "other_processes_cores": max(0.0, self.machine_cpu_s - ours) / wall,
            "relay_rss_peak_mb": self.relay_rss_peak_mb,
        }


@dataclass
class ResourceMonitor:
    """Samples the relay's RSS every `interval` seconds in a thread; times phases."""

    relay_pid: int
    postmaster_pid: int | None
    interval: float = 0.1
    samples: list[tuple[float, float, str]] = field(default_factory=list)  # (t, MB, phase)
    phases: dict[str, PhaseUsage] = field(default_factory=dict)
    _phase: str = "idle"
    _peak_mb: float = 0.0
    _started: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self._relay = psutil.Process(self.relay_pid)
        self._postgres: Any = None
        if self.postmaster_pid is not None:
            with contextlib.suppress(psutil.Error):
                self._postgres = psutil.Process(self.postmaster_pid)
                _tree_cpu_seconds(self._postgres)  # readable? (else: not measured)

    def rss_mb(self) -> float:
        """The relay's resident set size now (with its worker processes), in MiB."""
        total = self._relay.memory_info().rss
        for child in self._relay.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return float(total) / MB

    def process_rss_mb(self) -> list[dict[str, Any]]:
        """Each relay process's RSS now (issue 36): the relay itself (with `--workers` its
        supervisor), each worker, and multiprocessing's resource tracker, in MiB."""
        processes = []
        for proc in [self._relay, *self._relay.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                command = " ".join(proc.cmdline())
                role = (
                    "relay" if proc.pid == self._relay.pid
                    else "resource tracker" if "resource_tracker" in command
                    else "worker"
                )  # fmt: skip
                processes.append({"pid": proc.pid, "role": role,
                                  "rss_mb": proc.memory_info().rss / MB})  # fmt: skip
        return processes

    def _sample(self) -> None:
        with contextlib.suppress(psutil.Error):
            mb = self.rss_mb()
            self._peak_mb = max(self._peak_mb, mb)
            self.samples.append((time.monotonic() - self._started, mb, self._phase))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> ResourceMonitor:
        """Start sampling."""
        self._sample()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling (after one last sample)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._sample()

    def _postgres_cpu(self) -> float | None:
        if self._postgres is None:
            return None
        try:
            return _tree_cpu_seconds(self._postgres)
        except psutil.Error:
            return None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Account the block's wall and CPU time to phase `name` (added over repeats)."""
        usage = self.phases.setdefault(name, PhaseUsage())
        previous, self._phase, self._peak_mb = self._phase, name, self.rss_mb()
        wall, relay, own, pg, machine = (
            time.perf_counter(),
            _tree_cpu_seconds(self._relay),
            time.process_time(),
            self._postgres_cpu(),
            _system_busy_seconds(),
        )
        try:
            yield
        finally:
            pg_end = self._postgres_cpu()
            usage.wall_s += time.perf_counter() - wall
            usage.relay_cpu_s += _tree_cpu_seconds(self._relay) - relay
            usage.loadgen_cpu_s += time.process_time() - own
            usage.machine_cpu_s += _system_busy_seconds() - machine
            if usage.postgres_cpu_s is not None and pg is not None and pg_end is not None:
                usage.postgres_cpu_s += pg_end - pg
            else:
                usage.postgres_cpu_s = None
            self._sample()
            usage.relay_rss_peak_mb = max(usage.relay_rss_peak_mb, self._peak_mb)
            self._phase = previous
