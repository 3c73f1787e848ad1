"""One relay per test module for the account, pairing and handoff tests.

Tests isolate themselves with their own accounts, emails and vault ids; the
tests that need an exact view of the whole database (the dump) use the
per-test `relay` fixture of tests/relay/conftest.py instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import migrated_backend_database, takes_backend
from tests.relay.conftest import Relay, base_config
from tests.relay.support import serve


@pytest.fixture(scope="module")
@takes_backend
def served(request: pytest.FixtureRequest, postgres_url: str) -> Iterator[Relay]:
    """A relay on its own freshly migrated database, shared by one test module (and with
    `--citus-all` also on the Citus cluster, tests/conftest.py)."""
    with migrated_backend_database(request, postgres_url) as url, serve(base_config(url)) as relay:
        yield relay
