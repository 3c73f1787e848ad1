"""Shared fixtures: one PostgreSQL server per session, one fresh database per test.

``postgres_url`` is ``DATABASE_URL`` when set (CI with a real server), else one
embedded PostgreSQL started for the whole session in a temp dir outside /root.
``empty_database_url`` creates a new empty database on it (``test_<random>``),
``fresh_database_url`` also migrates it to head; both drop it afterwards.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from engram_sync.relay.db.embedded import EmbeddedPostgres
from engram_sync.relay.db.migrate import upgrade_to_head
from engram_sync.relay.db.url import to_libpq_url
from tests.citus_cluster import CitusCluster, CitusUnavailableError, running_cluster


def database_url_for(server_url: str, database: str) -> str:
    """Return ``server_url`` pointing at another database on the same server."""
    parts = urlsplit(to_libpq_url(server_url))
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, parts.fragment))


async def _execute(url: str, sql: str) -> None:
    conn = await asyncpg.connect(to_libpq_url(url))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a database on the session's server; create databases from it, not tables."""
    external = os.environ.get("DATABASE_URL", "").strip()
    if external:
        yield external
        return
    base = Path(tempfile.mkdtemp(prefix="engram-relay-test-pg-"))
    # A throwaway server: durability settings off make CREATE DATABASE ~4x faster.
    server = EmbeddedPostgres(
        base / "pgdata",
        database="postgres",
        settings={"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"},
    )
    try:
        server.start()
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    try:
        yield server.url_for("postgres")
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(base, ignore_errors=True)


@contextmanager
def scratch_database(postgres_url: str) -> Iterator[str]:
    """A brand-new empty database on the server of `postgres_url`, dropped on exit."""
    name = f"test_{secrets.token_hex(8)}"
    asyncio.run(_execute(postgres_url, f'CREATE DATABASE "{name}"'))
    try:
        yield database_url_for(postgres_url, name)
    finally:
        asyncio.run(_execute(postgres_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


#: ENGRAM_CITUS=1 (opt-in, issue 18): every test on `empty_database_url` /
#: `fresh_database_url` also runs on the Citus cluster (ids `[postgres]` and `[citus]`).
#: tests/relay/support.py's module-scoped relays do the same.
ON_CITUS_TOO = os.environ.get("ENGRAM_CITUS", "").strip() == "1"
DATABASE_PARAMS: dict[str, list[str]] = {"params": ["postgres", "citus"]} if ON_CITUS_TOO else {}


@contextmanager
def backend_database(request: pytest.FixtureRequest, postgres_url: str) -> Iterator[str]:
    """A new empty database on the backend of the fixture's param (`postgres` without
    one), dropped on exit: on Citus with the extension and the workers registered."""
    if getattr(request, "param", "postgres") != "citus":
        with scratch_database(postgres_url) as url:
            yield url
        return
    cluster: CitusCluster = request.getfixturevalue("citus_cluster")
    name = f"test_{secrets.token_hex(8)}"
    url = cluster.create_database(name)
    try:
        yield url
    finally:
        cluster.drop_database(name)


@pytest.fixture(**DATABASE_PARAMS)  # type: ignore[call-overload]
def empty_database_url(request: pytest.FixtureRequest, postgres_url: str) -> Iterator[str]:
    """A brand-new empty database (no migrations), dropped after the test (see above)."""
    with backend_database(request, postgres_url) as url:
        yield url


@pytest.fixture
def fresh_database_url(empty_database_url: str) -> str:
    """A brand-new database migrated to head, dropped after the test."""
    upgrade_to_head(empty_database_url)
    return empty_database_url


@pytest.fixture(scope="session")
def citus_cluster() -> Iterator[CitusCluster]:
    """A Citus coordinator and two workers for the session (issue 18, tests/citus_cluster.py).

    Citus is built once into a cache outside the repository (about 1-2 min on 2 cores the
    first time); skipped with the reason when it cannot be built here (no gcc/make).
    """
    try:
        with running_cluster(Path(sys.executable)) as (cluster, _build_s, _start_s):
            yield cluster
    except CitusUnavailableError as exc:
        pytest.skip(f"Citus unavailable: {exc}")


@pytest.fixture(scope="session")
def citus_url(citus_cluster: CitusCluster) -> str:
    """DATABASE_URL of a database on the coordinator, Citus created and the workers added."""
    return citus_cluster.create_database("engram_relay")
