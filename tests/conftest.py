"""Shared fixtures: one PostgreSQL server per session, one fresh database per test.

``postgres_url`` is ``DATABASE_URL`` when set (CI with a real server), else one
embedded PostgreSQL started for the whole session in a temp dir outside /root.
``empty_database_url`` creates a new empty database on it (``test_<random>``),
``fresh_database_url`` one migrated to head (a copy of a template database migrated once
per session); both drop it afterwards.
"""

from __future__ import annotations

import asyncio
import importlib.util
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
from tests import tiers
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
        try:
            yield external
        finally:
            _drop_templates(external)
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
    url = server.url_for("postgres")
    try:
        yield url
    finally:
        try:
            _drop_templates(url)
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


#: Which database tests get a `[citus]` case, a second case of the same test on the Citus
#: cluster (issue 18, deploy/SCALING.md §3; ids `[postgres]` and `[citus]`):
#: - by default those of the modules marked `pytest.mark.both_databases` (push rules, pull,
#:   compaction, concurrency, the zero-knowledge scans, the convergence machine, the
#:   schemathesis pass). They are collected always and run with `--citus` (tests/tiers.py:
#:   the `citus` tier; skipped as left out without it). The marker's name leaves out "citus"
#:   so that `-k citus` selects the `[citus]` cases alone;
#: - `--citus-all`: every test on a backend fixture (below), marked or not.
BACKENDS = ["postgres", "citus"]
_TAKES_BACKEND = "engram_takes_backend"
F = TypeVar("F", bound=Callable[..., object])


def takes_backend(fixture_function: F) -> F:
    """Mark a fixture function (under its `@pytest.fixture`) as one that makes its database
    with `backend_database(request, ...)`: `pytest_generate_tests` gives it the backend."""
    setattr(fixture_function, _TAKES_BACKEND, True)
    return fixture_function


def on_citus_too(definition: pytest.Item) -> bool:
    """Whether this test's database fixtures get the `[citus]` case too (see above)."""
    if tiers.citus_everywhere():
        return True
    return definition.get_closest_marker("both_databases") is not None


def backend_of(request: pytest.FixtureRequest) -> str:
    """`citus` in a test's `[citus]` case, else `postgres` (for a smaller CI size there)."""
    callspec = getattr(request.node, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    return "citus" if "citus" in params else "postgres"


def pytest_addoption(parser: pytest.Parser) -> None:
    tiers.add_options(parser)


#: tests/site/sitecustomize.py: the Argon2id memo of the test run's processes.
SITE = Path(__file__).resolve().parent / "site"


def _install_argon2_memo(config: pytest.Config) -> None:
    """Memoise the format's Argon2id derivations in this process and in every process the
    tests start (tests/site/sitecustomize.py says why and what stays real)."""
    spec = importlib.util.spec_from_file_location(
        "engram_test_argon2_memo", SITE / "sitecustomize.py"
    )
    assert spec is not None
    assert spec.loader is not None
    memo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(memo)
    directory = os.environ.get(memo.ENV)
    if not directory:  # the first process of the run (an xdist worker inherits the folder)
        directory = tempfile.mkdtemp(prefix="engram-test-argon2-")
        os.environ[memo.ENV] = directory
        config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
        paths = [str(SITE), *filter(None, [os.environ.get("PYTHONPATH")])]
        os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    memo.install(Path(directory))
    import argon2.low_level

    from engram_sync.shared_format import kdf

    kdf.hash_secret_raw = argon2.low_level.hash_secret_raw  # bound at its import, before


def pytest_configure(config: pytest.Config) -> None:
    tiers.configure(config)
    _install_argon2_memo(config)
    config.addinivalue_line(
        "markers",
        "both_databases: the module's database tests get a [citus] case too, run with --citus"
        " (issue 18, tests/conftest.py)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test's tiers (tests/tiers.py): before `-m` selects, so `-m citus` finds them."""
    tiers.apply(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The tests selected (after `-k`/`-m`): the ones the summary's "left out" counts."""
    session.config.stash[tiers.SELECTED] = list(session.items)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Iterator[None]:
    """The summary's last lines (after the durations and the short summary): what the tiers
    left out, and how to run it."""
    yield
    selected = terminalreporter.config.stash.get(tiers.SELECTED, [])
    # pytest-xdist's controller collects nothing itself: its workers' skips say what was left
    distributed = terminalreporter.config.pluginmanager.hasplugin("dsession")
    skipped = terminalreporter.stats.get("skipped", []) if distributed else []
    terminalreporter.section("test tiers (tests/tiers.py)", sep="-")
    for line in tiers.summary_lines(selected, skipped):
        terminalreporter.write_line(line)


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
    tiers.require("citus")
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


#: server URL -> the name of its template database, migrated to head once per session.
_templates: dict[str, str] = {}


def migrated_template(postgres_url: str) -> str:
    """The database on the server of `postgres_url` that `migrated_database` copies: made
    and migrated to head by the first call of the session (the `postgres_url` fixture drops
    it at the end)."""
    name = _templates.get(postgres_url)
    if name is None:
        name = f"template_{secrets.token_hex(8)}"
        asyncio.run(_execute(postgres_url, f'CREATE DATABASE "{name}"'))
        try:
            upgrade_to_head(database_url_for(postgres_url, name))
        except BaseException:
            asyncio.run(_execute(postgres_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            raise
        _templates[postgres_url] = name
    return name


def _drop_templates(postgres_url: str) -> None:
    name = _templates.pop(postgres_url, None)
    if name is not None:
        asyncio.run(_execute(postgres_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def _clone(postgres_url: str, template: str, name: str) -> None:
    """`CREATE DATABASE name TEMPLATE template`, then a generation of its own (what the
    migration 0004_generation gives every database it migrates, PROTOCOL §17)."""
    await _execute(postgres_url, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    conn = await asyncpg.connect(to_libpq_url(database_url_for(postgres_url, name)))
    try:
        await conn.execute(
            "UPDATE relay_meta SET generation = $1, changed_at = now()", secrets.token_hex(16)
        )
    finally:
        await conn.close()


@contextmanager
def migrated_database(postgres_url: str) -> Iterator[str]:
    """A new database migrated to head on the session's server, dropped on exit.

    A copy of the session's template (`CREATE DATABASE ... TEMPLATE`, about 0.1 s against
    0.4-1.0 s for running the migrations on every database); the tests of the migrations
    themselves run them on `empty_database_url`.
    """
    name = f"test_{secrets.token_hex(8)}"
    asyncio.run(_clone(postgres_url, migrated_template(postgres_url), name))
    try:
        yield database_url_for(postgres_url, name)
    finally:
        asyncio.run(_execute(postgres_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextmanager
def migrated_backend_database(request: pytest.FixtureRequest, postgres_url: str) -> Iterator[str]:
    """`migrated_database` on the backend of a `takes_backend` fixture's param: the template's
    copy on plain PostgreSQL, or a database migrated on the Citus cluster for a `[citus]`
    case (the migrations distribute the tables there, issue 18)."""
    if getattr(request, "param", "postgres") != "citus":
        with migrated_database(postgres_url) as url:
            yield url
        return
    with backend_database(request, postgres_url) as url:
        upgrade_to_head(url)
        yield url


@pytest.fixture
@takes_backend
def fresh_database_url(request: pytest.FixtureRequest, postgres_url: str) -> Iterator[str]:
    """A brand-new database migrated to head (`migrated_backend_database`), dropped after
    the test."""
    with migrated_backend_database(request, postgres_url) as url:
        yield url


@pytest.fixture(scope="session")
@tiers.needs("citus")
def citus_cluster() -> Iterator[CitusCluster]:
    """A Citus coordinator and two workers for the session (issue 18, tests/citus_cluster.py).

    Citus is built once into a cache outside the repository (about 1-2 min on 2 cores the
    first time). The `citus` tier (`--citus`); with it on, a Citus that cannot be built or
    started here (no gcc/make) is an error.
    """
    tiers.require("citus")
    try:
        with running_cluster(Path(sys.executable)) as (cluster, _build_s, _start_s):
            yield cluster
    except CitusUnavailableError as exc:
        tiers.unavailable("citus", f"Citus is unavailable: {exc}")


@pytest.fixture(scope="session")
def citus_url(citus_cluster: CitusCluster) -> str:
    """DATABASE_URL of a database on the coordinator, Citus created and the workers added."""
    return citus_cluster.create_database("engram_relay")
