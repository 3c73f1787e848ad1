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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar
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


#: Which database tests also run on the Citus cluster (issue 18, deploy/SCALING.md §3),
#: as a second case of the same test (ids `[postgres]` and `[citus]`):
#: - unset (CI's default): the tests of modules marked `pytest.mark.both_databases`
#:   (push rules, pull, compaction, concurrency, the zero-knowledge scans, the convergence
#:   machine, the schemathesis pass). The marker's name leaves out "citus" so that
#:   `-k citus` selects the `[citus]` cases alone;
#: - `ENGRAM_CITUS=1`: every test on a backend fixture (below), marked or not;
#: - `ENGRAM_CITUS=0`: none, plain PostgreSQL only.
#: Where Citus cannot be built or started the `[citus]` cases skip with the reason.
CITUS_MODE = os.environ.get("ENGRAM_CITUS", "").strip()
BACKENDS = ["postgres", "citus"]
_TAKES_BACKEND = "engram_takes_backend"
F = TypeVar("F", bound=Callable[..., object])


def takes_backend(fixture_function: F) -> F:
    """Mark a fixture function (under its `@pytest.fixture`) as one that makes its database
    with `backend_database(request, ...)`: `pytest_generate_tests` gives it the backend."""
    setattr(fixture_function, _TAKES_BACKEND, True)
    return fixture_function


def on_citus_too(definition: pytest.Item) -> bool:
    """Whether this test's database fixtures get the `[citus]` case too (see CITUS_MODE)."""
    if CITUS_MODE in ("0", "1"):
        return CITUS_MODE == "1"
    return definition.get_closest_marker("both_databases") is not None


def backend_of(request: pytest.FixtureRequest) -> str:
    """`citus` in a test's `[citus]` case, else `postgres` (for a smaller CI size there)."""
    callspec = getattr(request.node, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    return "citus" if "citus" in params else "postgres"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "both_databases: the module's database tests also run on the Citus cluster by default"
        " (issue 18, tests/conftest.py; ENGRAM_CITUS=0 turns it off)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise every backend fixture the test uses (its own scope: a module relay is
    started once per backend) over `BACKENDS`, when `on_citus_too`."""
    if not on_citus_too(metafunc.definition):
        return
    # The fixture that serves each name for this test is the last of its definitions
    # (a module's `relay` overrides tests/relay/conftest.py's).
    for name in metafunc.fixturenames:
        definitions = metafunc._arg2fixturedefs.get(name)
        if definitions and getattr(definitions[-1].func, _TAKES_BACKEND, False):
            metafunc.parametrize(name, BACKENDS, indirect=True)


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


@pytest.fixture
@takes_backend
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
