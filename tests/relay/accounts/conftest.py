"""One relay per test module for the account, pairing and handoff tests.

Tests isolate themselves with their own accounts, emails and vault ids; the
tests that need an exact view of the whole database (the dump) use the
per-test `relay` fixture of tests/relay/conftest.py instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.relay.conftest import Relay
from tests.relay.support import module_relay


@pytest.fixture(scope="module")
def served(postgres_url: str) -> Iterator[Relay]:
    """A relay on its own freshly migrated database, shared by one test module."""
    with module_relay(postgres_url) as relay:
        yield relay
