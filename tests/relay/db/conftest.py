"""Fixtures of the embedded-PostgreSQL tests: a scratch dir and a server in it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_sync.relay.db.embedded import EmbeddedPostgres


@pytest.fixture
def scratch_dir() -> Iterator[Path]:
    """A temp dir outside /root: pytest's tmp_path is private to root, and the server's OS
    user must traverse its parents (see embedded.py)."""
    path = Path(tempfile.mkdtemp(prefix="engram-relay-test-embedded-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server(scratch_dir: Path) -> Iterator[EmbeddedPostgres]:
    """An embedded server in the scratch dir (not started), stopped after the test."""
    pg = EmbeddedPostgres(scratch_dir / "pgdata")
    yield pg
    pg.stop()
