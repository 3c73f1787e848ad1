"""Metrics of `serve --workers N`: one scrape sums every worker (issue 14 item 16).

The supervisor makes a private directory (mode 0700, new and empty) before it spawns a
worker and names it in `PROMETHEUS_MULTIPROC_DIR`; every worker inherits the name, so
prometheus-client keeps its values in files there, and `/metrics` on any worker reads
them all (relay.services.metrics). When the supervisor replaces a worker that died, the dead
worker's live-gauge files are dropped (`mark_process_dead`), so the pool gauges count
live workers only, while its counters stay in the sums. The directory goes when `serve`
stops.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from socket import socket

from prometheus_client.multiprocess import mark_process_dead
from uvicorn import Config
from uvicorn.supervisors import Multiprocess

from engram_sync.relay.services.metrics import MULTIPROC_DIR_ENV

__all__ = ["WorkerSupervisor", "shared_metrics_dir"]


@contextlib.contextmanager
def shared_metrics_dir() -> Iterator[str]:
    """A fresh private directory in `PROMETHEUS_MULTIPROC_DIR` for the block, then removed
    (and the variable restored): set before the first worker is spawned."""
    directory = tempfile.mkdtemp(prefix="engram-relay-metrics-")  # mode 0700
    previous = os.environ.get(MULTIPROC_DIR_ENV)
    os.environ[MULTIPROC_DIR_ENV] = directory
    try:
        yield directory
    finally:
        if previous is None:
            os.environ.pop(MULTIPROC_DIR_ENV, None)
        else:
            os.environ[MULTIPROC_DIR_ENV] = previous
        shutil.rmtree(directory, ignore_errors=True)


class WorkerSupervisor(Multiprocess):
    """uvicorn's supervisor, which also marks every worker it stopped replacing (a dead
    or hung one, SIGHUP's restart, SIGTTOU) dead in the metrics directory."""

    def __init__(self, config: Config, sockets: list[socket], *, metrics_dir: str) -> None:
        super().__init__(config, sockets)
        self.metrics_dir = metrics_dir

    def keep_subprocess_alive(self) -> None:
        self._reaping(super().keep_subprocess_alive)

    def handle_signals(self) -> None:
        self._reaping(super().handle_signals)

    def _reaping(self, step: Callable[[], None]) -> None:
        before = self._worker_pids()
        step()
        for pid in before - self._worker_pids():
            mark_process_dead(pid, self.metrics_dir)  # type: ignore[no-untyped-call]

    def _worker_pids(self) -> set[int]:
        return {p.pid for p in self.processes if p.pid is not None}
