"""A new relay generation (relay.store.meta.new_generation, PROTOCOL §17: what
`engram-relay restore` writes) on a real Citus cluster (issue 18): `relay_meta` is a
reference table and its upsert runs there."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import asyncpg
import pytest

from engram_sync.relay.store.meta import new_generation, read_generation
from tests.citus_cluster import CitusCluster

RELAY = Path(sys.executable).with_name("engram-relay")
DATABASE = "citus_generation"


@pytest.fixture(scope="module")
def migrated_url(citus_cluster: CitusCluster) -> Iterator[str]:
    url = citus_cluster.create_database(DATABASE)
    try:
        result = subprocess.run(
            [str(RELAY), "migrate", "--database-url", url, "--citus"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        yield url
    finally:
        citus_cluster.drop_database(DATABASE)


def test_a_new_generation_replaces_the_row_on_citus(migrated_url: str) -> None:
    async def go() -> tuple[str, str, str, datetime, datetime]:
        conn = await asyncpg.connect(migrated_url)
        try:
            method = await conn.fetchval(
                "SELECT partmethod::text FROM pg_dist_partition"
                " WHERE logicalrelid = 'relay_meta'::regclass"
            )
            before = await read_generation(conn)
            changed_before = await conn.fetchval("SELECT changed_at FROM relay_meta")
            written = await new_generation(conn)  # the upsert's update path: the row exists
            after = await read_generation(conn)
            changed_after = await conn.fetchval("SELECT changed_at FROM relay_meta")
            assert written == after
            return str(method), before, after, changed_before, changed_after
        finally:
            await conn.close()

    method, before, after, changed_before, changed_after = asyncio.run(go())
    assert method == "n"  # a reference table
    assert after != before
    assert len(after) == 32
    assert changed_after > changed_before
