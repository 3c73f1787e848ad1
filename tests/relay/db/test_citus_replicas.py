"""The relay-process heartbeats (relay.store.replicas, issue 18) on a real Citus cluster:
`relay_processes` is a reference table and its two statements run there."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from engram_sync.relay.store.replicas import Replica, heartbeat, leave
from tests.citus_cluster import CitusCluster

RELAY = Path(sys.executable).with_name("engram-relay")


@pytest.fixture(scope="module")
def migrated_url(citus_cluster: CitusCluster) -> Iterator[str]:
    url = citus_cluster.create_database("citus_replicas")
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
        citus_cluster.drop_database("citus_replicas")


def test_heartbeats_count_and_leave_on_citus(migrated_url: str) -> None:
    async def go() -> tuple[str, list[int]]:
        conn = await asyncpg.connect(migrated_url)
        try:
            method = await conn.fetchval(
                "SELECT partmethod::text FROM pg_dist_partition"
                " WHERE logicalrelid = 'relay_processes'::regclass"
            )
            first, second = Replica(10.0), Replica(10.0)
            counts = [await heartbeat(conn, first), await heartbeat(conn, second)]
            counts.append(await heartbeat(conn, first))  # the upsert's update path
            await leave(conn, second)
            counts.append(await heartbeat(conn, first))
            return str(method), counts
        finally:
            await conn.close()

    method, counts = asyncio.run(go())
    assert method == "n"  # a reference table
    assert counts == [1, 2, 2, 1]
