"""bench.database's warm WAL (issue 36): a run's embedded server reuses WAL segments, as a
long-running server does, instead of creating (zero-filling) a new one every ~12 push
batches, which stalled a commit ~90 ms on whichever side of a lockstep pair crossed it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import asyncpg
import pytest

from bench import database
from bench.database import BenchDatabase
from engram_sync.relay.db.url import to_libpq_url

WARM_MB = 48


def _segments(pgdata: Path) -> set[str]:
    return {p.name for p in (pgdata / "pg_wal").iterdir() if len(p.name) == 24}


async def _since_checkpoint(url: str) -> int:
    """Bytes of WAL written since the last checkpoint's redo point."""
    conn = await asyncpg.connect(to_libpq_url(url))
    try:
        return int(await conn.fetchval(
            "SELECT pg_current_wal_lsn() - redo_lsn FROM pg_control_checkpoint()"
        ))  # fmt: skip
    finally:
        await conn.close()


async def _write_wal(url: str, megabytes: int) -> str:
    conn = await asyncpg.connect(to_libpq_url(url))
    try:
        for _ in range(megabytes):
            await conn.execute(database._MEGABYTE_OF_WAL)
        return str(await conn.fetchval("SHOW min_wal_size"))
    finally:
        await conn.close()


@pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")), reason="an embedded server only")
def test_a_warm_server_reuses_its_segments_instead_of_creating_new_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(database, "_WARM_WAL_MB", {"megabytes": WARM_MB})
    with BenchDatabase() as db:
        assert db._server is not None
        pgdata = db._server.data_dir
        before = _segments(pgdata)
        assert len(before) >= WARM_MB // 16  # written, checkpointed, kept for reuse
        # checkpointed before the run, not by the server during it
        assert asyncio.run(_since_checkpoint(db.url)) < 1024 * 1024
        min_wal_size = asyncio.run(_write_wal(db.url, WARM_MB // 2))
        after = _segments(pgdata)
    assert min_wal_size == f"{WARM_MB}MB"
    # the WAL written since went into recycled segments (renamed), not into new files
    assert len(after) <= len(before)
