"""The one PostgreSQL of a run: an embedded server in a temp dir (fsync left ON), or the
server of `DATABASE_URL`. Either way the run gets a new database migrated to head, used by
the relay and by the raw asyncpg ceiling alike, and removed afterwards."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from engram_sync.relay.db.embedded import EmbeddedPostgres
from engram_sync.relay.db.migrate import upgrade_to_head
from engram_sync.relay.db.url import redact_url, to_libpq_url

log = logging.getLogger(__name__)


def _with_database(server_url: str, database: str) -> str:
    parts = urlsplit(to_libpq_url(server_url))
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, parts.fragment))


async def _execute(url: str, sql: str) -> None:
    conn = await asyncpg.connect(to_libpq_url(url))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


# Issue 36: a new server creates each 16 MB WAL segment as its WAL grows, zero-filled, and
# the commit that needs it waits for that: about 90 ms, once every ~12 push batches of 500
# (measured: commit median 0.46 ms, p97 90 ms). A long-running server reuses the segments
# its checkpoints free instead, so such a stall is a new database's, and it fell on
# whichever side of a lockstep pair crossed the segment: relay push/ceiling repeats of
# 0.52-0.93 in one run. The run's embedded server is brought to that steady state first:
# `min_wal_size` as large as `max_wal_size` keeps every freed segment, and WAL written once
# (logical-decoding messages, no table) then checkpointed leaves them ready for reuse.
# The quick run (seconds) warms none: its figures are not judged.
_WARM_WAL_MB = {"megabytes": 1024}
_MEGABYTE_OF_WAL = "SELECT pg_logical_emit_message(false, 'bench', repeat('w', 1048576))"


def warm_wal(megabytes: int) -> None:
    """The WAL every embedded server of this process warms before its run (0: none)."""
    _WARM_WAL_MB["megabytes"] = megabytes


async def recycled_wal(url: str, megabytes: int) -> None:
    """`megabytes` of WAL segments written, checkpointed and kept for reuse (above)."""
    conn = await asyncpg.connect(to_libpq_url(url))
    try:
        await conn.execute(f"ALTER SYSTEM SET min_wal_size = '{int(megabytes)}MB'")
        await conn.execute(f"ALTER SYSTEM SET max_wal_size = '{int(megabytes)}MB'")
        await conn.execute("SELECT pg_reload_conf()")
        for _ in range(megabytes):
            await conn.execute(_MEGABYTE_OF_WAL)
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()


async def _server_facts(url: str) -> tuple[str, str]:
    """(server version, the durability settings) of the server at `url`."""
    conn = await asyncpg.connect(to_libpq_url(url))
    try:
        version = str(await conn.fetchval("SHOW server_version"))
        durability = [
            f"{name}={await conn.fetchval(f'SHOW {name}')}"
            for name in ("fsync", "synchronous_commit", "full_page_writes", "min_wal_size")
        ]
        return version, ", ".join(durability)
    finally:
        await conn.close()


def _scratch_base() -> Path:
    """A temp dir outside /root (the embedded server refuses a data dir in root's home)."""
    base = Path(tempfile.gettempdir()).resolve()
    home = Path.home().resolve()
    if os.geteuid() == 0 and (base == home or home in base.parents):
        base = Path("/var/tmp")  # noqa: S108 - mkdtemp makes a private dir in it
    return Path(tempfile.mkdtemp(prefix="engram-bench-", dir=base))


class BenchDatabase:
    """Start (or reach) PostgreSQL, create and migrate the run's database; undo on close."""

    def __init__(self) -> None:
        self.scratch = _scratch_base()  # also holds the client vaults of the run
        self.external = os.environ.get("DATABASE_URL", "").strip() or None
        self._server: EmbeddedPostgres | None = None
        self._server_url = ""
        self.url = ""
        self._databases: list[str] = []  # made by `another`, the run's own first
        self.server_version = ""
        self.durability = ""

    def __enter__(self) -> BenchDatabase:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Start or reach the server, then create and migrate the run's database."""
        if self.external is not None:
            self._server_url = self.external
            where = f"DATABASE_URL ({redact_url(self.external)})"
        else:
            # Default settings on purpose: fsync, synchronous_commit and full_page_writes
            # stay ON, so every commit is durable as in production.
            self._server = EmbeddedPostgres(self.scratch / "pgdata", database="postgres")
            self._server.start()
            self._server_url = self._server.url_for("postgres")
            where = f"embedded PostgreSQL in {self.scratch / 'pgdata'}"
        self.url = self.another()
        if self._server is not None and _WARM_WAL_MB["megabytes"] > 0:
            asyncio.run(recycled_wal(self.url, _WARM_WAL_MB["megabytes"]))
        self.server_version, self.durability = asyncio.run(_server_facts(self.url))
        log.info("database ready: %s, %s", where, self.durability)

    def another(self) -> str:
        """A new database on the run's server, migrated to head (dropped with the run's);
        its URL."""
        name = f"engram_bench_{secrets.token_hex(4)}"
        asyncio.run(_execute(self._server_url, f'CREATE DATABASE "{name}"'))
        self._databases.append(name)
        url = _with_database(self._server_url, name)
        upgrade_to_head(url)
        return url

    @property
    def where(self) -> str:
        """Where the database runs, for the report (no password)."""
        if self.external is not None:
            return f"DATABASE_URL server ({redact_url(self.external)})"
        return "embedded PostgreSQL started for the run (temp dir)"

    def postmaster_pid(self) -> int | None:
        """The server's pid when it is ours (for its CPU figures), else None."""
        if self._server is None:
            return None
        try:
            first = (self._server.data_dir / "postmaster.pid").read_text().splitlines()[0]
            return int(first)
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        """Drop the run's database (on a DATABASE_URL server), or stop the embedded server;
        remove the scratch dir."""
        try:
            for name in self._databases if self.external is not None else []:
                try:
                    asyncio.run(
                        _execute(self._server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    )
                except (OSError, asyncpg.PostgresError) as exc:
                    log.warning("could not drop the bench database %s: %s", name, exc)
            if self._server is not None:
                self._server.stop()
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)
