"""Engram Sync for a device: open a memory vault, write and read memories, sync them.

    from engram_sync.client import Vault

    with Vault.open("~/vault", passphrase, create=True) as vault:
        vault.link("http://127.0.0.1:8788", api_key)
        vault.add("Deploy with make ship", tags=["ops"])
        vault.sync()

This is the whole public API (docs/python-api.md); the modules with a leading underscore
are private and change without notice. The `engram-sync` CLI is built on the same code.

The names are loaded when first used (PEP 562), so importing a private module such as the
CLI does not pay for the sync engine and the relay client (issue 17, docs/agent.md).
"""

from __future__ import annotations

import importlib

from engram_sync import __version__

# `typing` is not imported at run time: the agent's fast path (client._cli.fast) imports
# this package and pays for every module it loads (docs/agent.md "Read commands"). mypy
# takes any name TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Final

    from engram_sync.shared_format.errors import VaultError, WrongPassphraseError
    from engram_sync.shared_format.plaintext import Link, MemoryPlaintext

    from ._api import Layer, Progress, Vault, VaultStatus
    from ._errors import (
        AnswerTooLargeError,
        AuthError,
        DeviceRevokedError,
        ForbiddenError,
        OutcomeUnknownError,
        ProtocolError,
        QuotaExceededError,
        RateLimitedError,
        RelayError,
        RelayMisbehavedError,
        RelayUnavailableError,
        ResyncRequiredError,
        SyncError,
        VaultRetiredError,
    )
    from ._flows.live import LiveStatus
    from ._flows.rekey import RekeyError, RekeyReport
    from ._session import NotLinkedError
    from ._sync.reports import SyncReport
    from ._vault.history import HistoryError, Retention, Version, Writer
    from ._vault.revert import RevertPlan

    #: A memory as the vault holds it (VAULT.md; PROTOCOL §4).
    Memory = MemoryPlaintext

_ERRORS: Final = "engram_sync.client._errors"
_FORMAT_ERRORS: Final = "engram_sync.shared_format.errors"

#: Where each public name lives: (module, name there).
_WHERE: Final[dict[str, tuple[str, str]]] = {
    "AnswerTooLargeError": (_ERRORS, "AnswerTooLargeError"),
    "AuthError": (_ERRORS, "AuthError"),
    "DeviceRevokedError": (_ERRORS, "DeviceRevokedError"),
    "ForbiddenError": (_ERRORS, "ForbiddenError"),
    "HistoryError": ("engram_sync.client._vault.history", "HistoryError"),
    "Layer": ("engram_sync.client._api", "Layer"),
    "Link": ("engram_sync.shared_format.plaintext", "Link"),
    "LiveStatus": ("engram_sync.client._flows.live", "LiveStatus"),
    "Memory": ("engram_sync.shared_format.plaintext", "MemoryPlaintext"),
    "NotLinkedError": ("engram_sync.client._session", "NotLinkedError"),
    "OutcomeUnknownError": (_ERRORS, "OutcomeUnknownError"),
    "Progress": ("engram_sync.client._api", "Progress"),
    "ProtocolError": (_ERRORS, "ProtocolError"),
    "QuotaExceededError": (_ERRORS, "QuotaExceededError"),
    "RateLimitedError": (_ERRORS, "RateLimitedError"),
    "RekeyError": ("engram_sync.client._flows.rekey", "RekeyError"),
    "Retention": ("engram_sync.client._vault.history", "Retention"),
    "RevertPlan": ("engram_sync.client._vault.revert", "RevertPlan"),
    "RekeyReport": ("engram_sync.client._flows.rekey", "RekeyReport"),
    "RelayError": (_ERRORS, "RelayError"),
    "RelayMisbehavedError": (_ERRORS, "RelayMisbehavedError"),
    "RelayUnavailableError": (_ERRORS, "RelayUnavailableError"),
    "ResyncRequiredError": (_ERRORS, "ResyncRequiredError"),
    "SyncError": (_ERRORS, "SyncError"),
    "SyncReport": ("engram_sync.client._sync.engine", "SyncReport"),
    "Vault": ("engram_sync.client._api", "Vault"),
    "VaultStatus": ("engram_sync.client._api", "VaultStatus"),
    "VaultError": (_FORMAT_ERRORS, "VaultError"),
    "VaultRetiredError": (_ERRORS, "VaultRetiredError"),
    "Version": ("engram_sync.client._vault.history", "Version"),
    "Writer": ("engram_sync.client._vault.history", "Writer"),
    "WrongPassphraseError": (_FORMAT_ERRORS, "WrongPassphraseError"),
}


def __getattr__(name: str) -> Any:
    """A public name, imported on first use and then kept in the module (PEP 562)."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where[0]), where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "AnswerTooLargeError",
    "AuthError",
    "DeviceRevokedError",
    "ForbiddenError",
    "HistoryError",
    "Layer",
    "Link",
    "LiveStatus",
    "Memory",
    "NotLinkedError",
    "OutcomeUnknownError",
    "Progress",
    "ProtocolError",
    "QuotaExceededError",
    "RateLimitedError",
    "RekeyError",
    "RekeyReport",
    "RelayError",
    "RelayMisbehavedError",
    "RelayUnavailableError",
    "ResyncRequiredError",
    "Retention",
    "RevertPlan",
    "SyncError",
    "SyncReport",
    "Vault",
    "VaultError",
    "VaultRetiredError",
    "VaultStatus",
    "Version",
    "Writer",
    "WrongPassphraseError",
    "__version__",
]
