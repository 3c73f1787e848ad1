"""Fixtures of the reliability suites."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.reliability.support import RelayProcess


@pytest.fixture
def relay_process(fresh_database_url: str) -> Iterator[RelayProcess]:
    """`engram-relay serve` as a real process on a fresh database, stopped at the end."""
    relay = RelayProcess(fresh_database_url)
    relay.start()
    try:
        yield relay
    finally:
        relay.stop()
