"""One relay per test module for the account, pairing and handoff tests.

Tests isolate themselves with their own accounts, emails and vault ids; the
tests that need an exact view of the whole database (the dump) use the
per-test `relay` fixture of tests/relay/conftest.py instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engram_sync.relay.db.migrate import upgrade_to_head
from tests.conftest import backend_database, takes_backend
from tests.relay.conftest import Relay, base_config
from tests.relay.support import serve


@pytest.fixture(scope="module")
@takes_backend
def served(request: pytest.FixtureRequest, postgres_url: str) -> Iterator[Relay]:
    """A relay on its own freshly migrated database, shared by one test module (and with
    ENGRAM_CITUS=1 also on the Citus cluster, tests/conftest.py)."""
    with backend_database(request, postgres_url) as url:
        upgrade_to_head(url)
        with serve(base_config(url)) as relay:
            yield relay
