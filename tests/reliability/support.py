"""Shared pieces of the reliability suites."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import asyncpg
import httpx

from engram_sync.relay.db.url import to_libpq_url
from tests.relay.conftest import ADMIN_KEY, METRICS_TOKEN, free_port

BIN = Path(sys.executable).parent


class RelayProcess:
    """`engram-relay serve` as a real process on a fixed port, killable and restartable."""

    def __init__(
        self,
        database_url: str,
        *,
        log_path: Path | None = None,
        log_level: str = "warning",
        bin_dir: Path = BIN,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        start_timeout_s: float = 60.0,
    ) -> None:
        self.bin_dir = bin_dir  # the environment whose `engram-relay` runs
        self.env = env or {}  # more variables for the process (ENGRAM_RELAY_*)
        self.args = args  # more options of `serve` (e.g. --workers 2)
        self.start_timeout_s = start_timeout_s  # workers start slowly on a loaded machine
        self.log_path = log_path
        self.log_level = log_level
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database_url = database_url
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {  # self.env may set SYNC_API_KEYS too (more keys than the admin's)
            **os.environ,
            "SYNC_API_KEYS": f"{ADMIN_KEY}:100000",
            "ENGRAM_RELAY_METRICS_TOKEN": METRICS_TOKEN,
            **self.env,
        }
        log = self.log_path.open("ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [str(self.bin_dir / "engram-relay"), "serve", "--port", str(self.port),
             "--database-url", self.database_url, "--log-level", self.log_level, *self.args],
            env=env, stdout=log, stderr=log,
        )  # fmt: skip
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise AssertionError("relay did not start")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


@contextmanager
def two_relay_processes(
    database_url: str, env: Mapping[str, str]
) -> Iterator[tuple[RelayProcess, RelayProcess]]:
    """Two `engram-relay serve` processes on one database with the same extra settings,
    both stopped at the end."""
    first = RelayProcess(database_url, env=dict(env))
    second = RelayProcess(database_url, env=dict(env))
    first.start()
    try:
        second.start()
        try:
            yield first, second
        finally:
            second.stop()
    finally:
        first.stop()


async def _database_text(database_url: str) -> str:
    conn = await asyncpg.connect(to_libpq_url(database_url))
    try:
        tables = [
            r["tablename"]
            for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname='public'")
        ]
        parts = []
        for table in tables:
            rows = await conn.fetch(f'SELECT row_to_json(t)::text AS j FROM "{table}" t')
            parts.extend(r["j"] for r in rows)
        return "\n".join(parts)
    finally:
        await conn.close()


def database_text(database_url: str) -> str:
    """Every column of every row of the relay's PostgreSQL, as JSON text, to search for
    what must never reach it (the zero-knowledge and strict_local suites)."""
    return asyncio.run(_database_text(database_url))
