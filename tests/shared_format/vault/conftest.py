"""Fixtures for the vault tests (real SQLCipher, real Argon2id derived once per input)."""

from __future__ import annotations

import pytest

from engram_sync.shared_format.vault import store

from .helpers import cached_passphrase_vault_key


@pytest.fixture(autouse=True)
def _memoised_argon2(monkeypatch: pytest.MonkeyPatch) -> None:
    """open_vault derives through a memo: the same function and output, computed once."""
    monkeypatch.setattr(store, "passphrase_vault_key", cached_passphrase_vault_key)
