"""Ending a bench's helper process that reads commands on its stdin and is watched by a
reader thread (bench.live_latency's receiver, bench.history's watchers)."""

from __future__ import annotations

import contextlib
import subprocess
import threading


def end_child(proc: subprocess.Popen[str], reader: threading.Thread, *, wait_s: float) -> None:
    """Close its stdin (its signal to stop), wait `wait_s` for it, kill it if it is still
    running, then join the thread reading its output."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
    reader.join(timeout=30)
