"""What the engine's helpers (anti_entropy, strict_local) use of a `Syncer`, as a
Protocol: they take the engine's parts without importing the engine, which imports them
(issue 32: no circles in the client's layers). `client._sync.engine.Syncer` is the one
implementation; mypy checks that it fits where it is passed."""

from __future__ import annotations

import sqlite3
from typing import Protocol

from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.vault import Vault
from engram_sync.shared_format.wire import SyncBlob

from .._http.relay_client import RelayClient
from .._vault.history import PageKeeper
from .device import Device
from .reports import SyncReport
from .state import SyncState


class SyncerParts(Protocol):
    """One vault, its keys' cipher, its device, its sync state and its relay, with the
    engine's steps that the helpers repeat: apply or skip one blob, push a batch."""

    vault: Vault
    cipher: BlobCipher
    device: Device
    state: SyncState
    relay: RelayClient
    vault_id: str
    push_batch: int

    def push(self, report: SyncReport) -> None: ...

    def _apply_blob(
        self,
        conn: sqlite3.Connection,
        blob: SyncBlob,
        report: SyncReport,
        *,
        ceiling: int = 0,
        keeper: PageKeeper | None = None,
    ) -> bool: ...

    def _skip(self, blob: SyncBlob, reason: str, report: SyncReport) -> bool: ...

    def _push_batch(
        self, items: list[tuple[str, str, str | None]], *, deleted: bool, report: SyncReport
    ) -> None: ...
