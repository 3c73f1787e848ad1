"""Engram Sync for a device: open a memory vault, write and read memories, sync them.

    from engram_sync.client import Vault

    with Vault.open("~/vault", passphrase, create=True) as vault:
        vault.link("http://127.0.0.1:8788", api_key)
        vault.add("Deploy with make ship", tags=["ops"])
        vault.sync()

This is the whole public API (docs/python-api.md); the modules with a leading underscore
are private and change without notice. The `engram-sync` CLI is built on the same code.
"""

from engram_sync import __version__
from engram_sync.client._api import Layer, Progress, Vault
from engram_sync.client._errors import (
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
from engram_sync.client._session import NotLinkedError
from engram_sync.client._sync.engine import SyncReport
from engram_sync.client._sync.live import LiveStatus
from engram_sync.client._sync.rekey import RekeyError, RekeyReport
from engram_sync.shared_format.errors import VaultError, WrongPassphraseError
from engram_sync.shared_format.plaintext import Link, MemoryPlaintext

#: A memory as the vault holds it (VAULT.md; PROTOCOL §4).
Memory = MemoryPlaintext

__all__ = [
    "AnswerTooLargeError",
    "AuthError",
    "DeviceRevokedError",
    "ForbiddenError",
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
    "SyncError",
    "SyncReport",
    "Vault",
    "VaultError",
    "VaultRetiredError",
    "WrongPassphraseError",
    "__version__",
]
