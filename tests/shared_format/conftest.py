"""Shared fixtures for shared_format tests: derive the golden keys once per session."""

from __future__ import annotations

import pytest

from engram_sync.shared_format.sync_keys import SyncKeys, derive_sync_keys

GOLDEN_PASSPHRASE = "correct-horse-battery-staple"


@pytest.fixture(scope="session")
def golden_keys() -> SyncKeys:
    """The PROTOCOL §2 known-answer keys (one Argon2id pair per test session)."""
    return derive_sync_keys(GOLDEN_PASSPHRASE)
