"""The test Citus cluster itself (tests/citus_cluster.py, issue 18): a coordinator and two
workers on 127.0.0.1, reached with the password only, and data that really spreads."""

from __future__ import annotations

import asyncio
import os
import pwd
import sys
from pathlib import Path

import asyncpg
import pytest

from tests.citus_cluster import (
    HOST,
    CitusCluster,
    CitusUnavailableError,
    build_key,
    ensure_citus_build,
)


async def _fetch(url: str, sql: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


def test_the_coordinator_has_two_active_workers(citus_url: str) -> None:
    workers = asyncio.run(_fetch(citus_url, "SELECT * FROM citus_get_active_worker_nodes()"))
    assert len(workers) == 2
    coordinator = asyncio.run(
        _fetch(citus_url, "SELECT nodename FROM pg_dist_node WHERE groupid = 0")
    )
    assert [row["nodename"] for row in coordinator] == [HOST]


def test_a_distributed_table_spreads_over_both_workers(citus_cluster: CitusCluster) -> None:
    url = citus_cluster.create_database("spread")
    try:

        async def go() -> list[asyncpg.Record]:
            conn = await asyncpg.connect(url)
            try:
                await conn.execute("CREATE TABLE t (k text PRIMARY KEY)")
                await conn.execute("SELECT create_distributed_table('t', 'k')")
                await conn.execute("INSERT INTO t SELECT g::text FROM generate_series(1, 100) g")
                return list(
                    await conn.fetch(
                        "SELECT nodeport, count(*) FROM citus_shards GROUP BY nodeport"
                    )
                )
            finally:
                await conn.close()

        ports = {row["nodeport"] for row in asyncio.run(go())}
        assert ports == {worker.port for worker in citus_cluster.workers}
    finally:
        citus_cluster.drop_database("spread")


def test_nodes_refuse_a_login_without_the_password(citus_cluster: CitusCluster) -> None:
    url = citus_cluster.url(citus_cluster.coordinator, "postgres")
    no_password = url.replace(f":{citus_cluster.password}@", "@")
    assert no_password != url
    with pytest.raises(asyncpg.InvalidPasswordError):
        asyncio.run(_fetch(no_password, "SELECT 1"))
    assert asyncio.run(_fetch(url, "SELECT 1"))  # and the password lets one in


def test_the_servers_run_as_a_non_root_user(citus_cluster: CitusCluster) -> None:
    pid = int((citus_cluster.coordinator.data_dir / "postmaster.pid").read_text().split()[0])
    owner = os.stat(f"/proc/{pid}").st_uid
    assert owner != 0
    if os.geteuid() == 0:
        assert pwd.getpwuid(owner).pw_name == "embedded_postgres"


def test_no_build_tool_is_a_skip_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_CITUS_TOOLS", str(tmp_path / "none"))
    with pytest.raises(CitusUnavailableError, match="no Citus build tool"):
        ensure_citus_build(Path(sys.executable))


def test_no_compiler_is_a_skip_reason_and_a_cached_build_needs_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "build.sh").write_text("exit 1\n")
    (tools / "citus-src.tar.gz").write_bytes(b"not the real source")
    monkeypatch.setenv("ENGRAM_CITUS_TOOLS", str(tools))
    monkeypatch.setenv("ENGRAM_CITUS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(CitusUnavailableError, match="needs gcc and make"):
        ensure_citus_build(Path(sys.executable))
    # the positive case next to it: a build in the cache is used without any compiler
    dest = tmp_path / "cache" / build_key(Path(sys.executable))
    (dest / "lib").mkdir(parents=True)
    (dest / "lib" / "citus.so").write_bytes(b"")
    (dest / ".citus-built").write_text("stamp\n")
    assert ensure_citus_build(Path(sys.executable)) == dest
