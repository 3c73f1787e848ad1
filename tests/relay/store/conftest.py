"""The store modules' database: one migrated database per module and backend (on Citus too
in a `both_databases` module, tests/conftest.py `takes_backend`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import takes_backend
from tests.relay.support import migrated_backend_database


@pytest.fixture(scope="module")
@takes_backend
def database_url(request: pytest.FixtureRequest, postgres_url: str) -> Iterator[str]:
    with migrated_backend_database(request, postgres_url) as url:
        yield url
