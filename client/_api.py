"""The public face of the client: a memory vault on this device, and its sync.

`engram_sync.client` re-exports `Vault` (this module's only class) with the types and
errors it uses; every other module of the client is private (docs/python-api.md).
"""

from __future__ import annotations

import builtins
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from engram_sync.shared_format.plaintext import (
    LINK_TYPES,
    SOURCES,
    LinkType,
    MemoryPlaintext,
    PrivacyLevel,
)

from ._errors import RateLimitedError, RelayUnavailableError, SyncError
from ._flows.live import LiveStatus, LiveSync
from ._flows.rekey import Rekey, RekeyReport
from ._session import VaultSession
from ._sync.reports import SyncReport
from ._vault import history, local_writes, store
from ._vault.history import Retention, Version
from ._vault.privacy import PRIVACY_LEVELS, queue_retraction
from ._vault.revert import RevertPlan, Selector, plan_revert, run_revert
from ._vault.search import SearchFilters, search_memories

Layer = Literal["episodic", "semantic", "imagined"]
#: Called with the phase ("pull" or "push") and the counts so far, during a sync.
Progress = Callable[[str, SyncReport], None]
SCOPES = ("moment", "episode", "narrative", "rule")  # VAULT §3
LAYERS = ("episodic", "semantic", "imagined")  # VAULT §3


@dataclass(frozen=True)
class VaultStatus:
    """Where a vault stands for sync, read from this device alone (no relay call)."""

    relay: str | None  # the linked relay's URL, None before `link`
    vault_id: str | None
    last_sync_at: str | None  # the last sync that finished (RFC 3339), by any program
    pending_pushes: int  # memories written here and not yet pushed
    pending_tombstones: int  # deletions not yet pushed
    local_only: int  # strict_local memories (never pushed)


class Vault:
    """A memory vault (an encrypted `engrams.db` in a directory) opened with its passphrase.

    Open it with `Vault.open` (a context manager). Writes are local and immediate; `sync`
    exchanges them, encrypted, with the relay the vault is linked to.
    """

    def __init__(self, session: VaultSession) -> None:
        self._session = session

    @classmethod
    def open(cls, path: str | os.PathLike[str], passphrase: str, *, create: bool = False) -> Vault:
        """Open the vault in directory `path` (with `create`, make it first if missing).

        Raises `WrongPassphraseError` when the passphrase does not open it; nothing is
        written then.
        """
        return cls(VaultSession.open(Path(path).expanduser(), passphrase, create=create))

    @classmethod
    def open_unlocked(cls, path: str | os.PathLike[str]) -> Vault | None:
        """Open the vault in directory `path` with the keys the unlock agent holds for it
        (`engram-sync unlock`, docs/agent.md): no passphrase needed. None when no agent
        runs, it holds no keys for this vault, or they no longer open it."""
        from ._agent.unlocked import unlocked_session

        session = unlocked_session(Path(path).expanduser())
        return None if session is None else cls(session)

    @staticmethod
    def is_unlocked(path: str | os.PathLike[str]) -> bool:
        """Whether the unlock agent holds the keys of the vault in `path` now. A program
        that opened it with `open_unlocked` asks this before each use, to follow
        `engram-sync lock`; asking counts as a use of the keys, as a command does, so the
        agent's idle timeout runs from the last one (docs/agent.md)."""
        from ._agent.control import held_keys

        return held_keys(Path(path).expanduser()) is not None

    def close(self) -> None:
        """Close the vault's database."""
        self._session.close()

    def __enter__(self) -> Vault:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def path(self) -> Path:
        """The vault's directory."""
        return self._session.path

    @property
    def device_id(self) -> str:
        """This device's id (PROTOCOL §1)."""
        return self._session.device.device_id

    @property
    def vault_id(self) -> str | None:
        """The vault id on the relay, once linked."""
        return self._session.config.vault_id

    # -- memories ---------------------------------------------------------------------------

    def add(
        self,
        content: str,
        *,
        tags: Iterable[str] = (),
        project: str | None = None,
        layer: Layer = "episodic",
        privacy_level: PrivacyLevel = "cloud_first",
        scope: str = "moment",
        source: str = "user",
        context: Mapping[str, Any] | None = None,
    ) -> str:
        """Write a new memory; returns its id. It is pushed by the next `sync`, unless its
        `privacy_level` is "strict_local": then it never leaves this device
        (docs/privacy.md). `source` says who wrote it (VAULT §3, e.g. "ai-tool") and
        `context` is its JSON context object: an AI tool's name goes in
        `{"tool": {"name": ..., "version": ...}}`, which `revert(tool=...)` selects on
        (docs/history.md)."""
        if not content.strip():
            raise ValueError("a memory's content must not be empty")
        if privacy_level not in PRIVACY_LEVELS:
            raise ValueError(f"privacy_level must be one of {', '.join(PRIVACY_LEVELS)}")
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}")
        if source not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}")
        with self._session.vault.transaction() as conn:
            return store.add_memory(
                conn, content, layer=layer, tags=tags, project=project,
                privacy_level=privacy_level, scope=scope, source=source, context=context,
            )  # fmt: skip

    def get(self, memory_id: str) -> MemoryPlaintext | None:
        """One memory, or None when there is none with this id."""
        return store.get_memory(self._session.vault.conn, memory_id)

    def list(self) -> list[MemoryPlaintext]:
        """Every memory, oldest first."""
        return store.list_memories(self._session.vault.conn)

    def recent(
        self, limit: int = 20, *, project: str | None = None
    ) -> builtins.list[MemoryPlaintext]:
        """The `limit` most recently modified memories (only `project`'s, when given),
        newest first."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        return store.recent_memories(self._session.vault.conn, limit, project)

    def search(
        self,
        query: str,
        *,
        limit: int = 20,
        tags: Iterable[str] = (),
        project: str | None = None,
        layer: Layer | None = None,
    ) -> builtins.list[MemoryPlaintext]:
        """The memories whose content has every word of `query` or, when none has them all,
        any of them (a substring search where the index cannot answer), best bm25 rank
        first, then the most recently modified, then by id (docs/search.md). `tags` (all of
        them), `project` and `layer` narrow the search."""
        filters = SearchFilters(tuple(tags), project, layer)
        return search_memories(self._session.vault.conn, query, limit, filters)

    def edit(
        self,
        memory_id: str,
        content: str | None = None,
        *,
        privacy_level: PrivacyLevel | None = None,
        tags: Iterable[str] | None = None,
        project: str | None = None,
        layer: Layer | None = None,
        source: str = "user",
        tool: str | None = None,
    ) -> bool:
        """Replace a memory's content, change its privacy level, or replace its tags (all
        of them: `[]` removes them), project or layer; any of these at once, as one new
        version (None leaves a field as it is). False when there is no such memory. Made
        "strict_local", its later versions stay on this device (the copy already synced
        stays elsewhere until `retract`); made syncing again, it is pushed by the next
        `sync` (docs/privacy.md). `source` and `tool` (an AI tool's name) are recorded as
        the writer in the local history (docs/history.md)."""
        new_tags = None if tags is None else builtins.list(tags)
        if all(v is None for v in (content, privacy_level, new_tags, project, layer)):
            raise ValueError(
                "nothing to change: give content, privacy_level, tags, project or layer"
            )
        if content is not None and not content.strip():
            raise ValueError("a memory's content must not be empty")
        if privacy_level is not None and privacy_level not in PRIVACY_LEVELS:
            raise ValueError(f"privacy_level must be one of {', '.join(PRIVACY_LEVELS)}")
        if layer is not None and layer not in LAYERS:
            raise ValueError(f"layer must be one of {', '.join(LAYERS)}")
        if project is not None and not project.strip():
            raise ValueError("a project must not be empty")
        session = self._session
        with session.vault.transaction() as conn:
            previous = local_writes.edit(
                conn, memory_id, content, privacy_level, session.writer(source=source, tool=tool),
                own_device=session.device.device_id, tags=new_tags, project=project, layer=layer,
            )  # fmt: skip
        return previous is not None

    def retract(self, memory_id: str) -> None:
        """Queue a deletion, pushed by the next `sync`, of the copy the relay and the other
        devices hold of a strict_local memory; the memory stays here (docs/privacy.md).
        ValueError when it is not a strict_local memory of this vault."""
        with self._session.vault.transaction() as conn:
            queue_retraction(conn, memory_id)

    def delete(self, memory_id: str, *, source: str = "user", tool: str | None = None) -> bool:
        """Delete a memory (the deletion syncs too); False when there is no such memory.
        `source` and `tool` are recorded as the writer in the local history."""
        session = self._session
        by = session.writer(source=source, tool=tool)
        with session.vault.transaction() as conn:
            return local_writes.delete(conn, memory_id, by, own_device=session.device.device_id)

    def link_memories(
        self,
        source_id: str,
        target_id: str,
        link_type: LinkType = "associative",
        *,
        weight: float = 0.5,
        source: str = "user",
        tool: str | None = None,
    ) -> bool:
        """Link memory `source_id` to `target_id` (replacing a link between them), as a
        new version of the source memory that the next `sync` pushes; False when either is
        missing. `link_type`: associative, causal, analogical or temporal; `weight` in
        [0, 1]. A link to a strict_local memory never leaves this device."""
        if link_type not in LINK_TYPES:
            raise ValueError(f"link_type must be one of {', '.join(sorted(LINK_TYPES))}")
        if not 0.0 <= weight <= 1.0:
            raise ValueError("weight must be between 0 and 1")
        if source_id == target_id:
            raise ValueError("a memory cannot link to itself")
        session = self._session
        by = session.writer(source=source, tool=tool)
        with session.vault.transaction() as conn:
            return local_writes.link(
                conn, source_id, target_id, link_type, weight, by,
                own_device=session.device.device_id,
            )  # fmt: skip

    # -- history (docs/history.md) ---------------------------------------------------------

    def history(self, memory_id: str) -> builtins.list[Version]:
        """The versions of a memory this device kept, oldest first, then the one it holds
        now (`current`; a deletion when deleted). Empty when it knows nothing of it."""
        return history.versions(self._session.vault.conn, memory_id, self.device_id)

    def restore(self, memory_id: str, version: int) -> None:
        """Bring kept version `version` (its number in `history`) back as the memory's
        newest version: the next `sync` pushes it with a new clock, so it wins everywhere.
        `HistoryError` when that version is not kept (or is a deletion)."""
        session = self._session
        with session.vault.transaction() as conn:
            history.restore(conn, memory_id, version, session.writer(), own_device=self.device_id)

    def undelete(self, *memory_ids: str, source: str = "user", tool: str | None = None) -> None:
        """Bring deleted memories back (each its newest kept version), as new versions the
        next `sync` pushes. `HistoryError` (nothing changed) when one is not deleted or has
        no version kept. `source` and `tool` are recorded as the writer."""
        session = self._session
        by = session.writer(source=source, tool=tool)
        with session.vault.transaction() as conn:
            for memory_id in memory_ids:
                history.undelete(conn, memory_id, by, own_device=self.device_id)

    def revert(
        self,
        *,
        device: str | None = None,
        source: str | None = None,
        tool: str | None = None,
        since: datetime | None = None,
        dry_run: bool = False,
    ) -> RevertPlan:
        """Take back what one device (`device`), source (e.g. "ai-tool") or AI tool
        (`tool`, the name in a memory's context) wrote, after `since` (an aware datetime):
        every memory whose current version they wrote goes back to the version before
        their writes, is undeleted, or is deleted when they created it. Returns the plan
        (its `unrevertible` memories have no earlier version kept); with `dry_run` nothing
        is written. The next `sync` takes it to every device. Run again after a crash, it
        finishes what is left."""
        selector = Selector(device, source, tool, since)
        plan = plan_revert(self._session.vault.conn, selector, self.device_id)
        if not dry_run:
            run_revert(self._session.vault, plan.steps, self._session.writer(),
                       own_device=self.device_id)  # fmt: skip
        return plan

    def history_retention(self, retention: Retention | None = None) -> Retention:
        """The history's retention (days, percent of the vault's size, minimum bytes);
        with `retention`, set it first."""
        with self._session.vault.transaction() as conn:
            if retention is not None:
                history.set_retention(conn, retention)
            return history.retention(conn)

    # -- sync -------------------------------------------------------------------------------

    def status(self) -> VaultStatus:
        """Where the vault stands for sync (docs/python-api.md), read from this device's
        files now, so a sync by another program (`engram-sync sync`) shows."""
        from ._sync.config import load_sync_config
        from ._sync.state import SyncState

        config = load_sync_config(self.path)
        conn = self._session.vault.conn
        pushes, tombstones = store.count_to_push(conn)
        local_only = conn.execute(
            "SELECT count(*) FROM engrams WHERE privacy_level = 'strict_local'"
        ).fetchone()[0]
        return VaultStatus(
            relay=config.server_url or None,
            vault_id=config.vault_id,
            last_sync_at=SyncState.load(self.path).last_sync_at,
            pending_pushes=pushes,
            pending_tombstones=tombstones,
            local_only=int(local_only),
        )

    def link(
        self, relay_url: str, api_key: str, *, vault_id: str | None = None, label: str | None = None
    ) -> str:
        """Point the vault at a relay with an API key; returns the vault id it syncs as.

        Without `vault_id`, the id comes from the passphrase (PROTOCOL §2).
        """
        return self._session.link(relay_url, api_key, vault_id, label)

    def sync(self, *, progress: Progress | None = None) -> SyncReport:
        """Pull what the other devices wrote, then push what this one wrote (PROTOCOL §8).

        Raises `NotLinkedError` before `link`, and a `SyncError` subclass when the relay
        refuses, cannot be reached, or answers what the protocol does not allow.
        """
        # one connection pool and one /v1/info per session, not per sync (issue 36)
        return self._session.syncer(self._session.shared_relay(), progress).sync()

    def rekey(
        self,
        new_passphrase: str | None = None,
        *,
        new_api_key: str | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> RekeyReport:
        """Move the vault to new keys and a new vault id, then retire the old vault on the
        relay (PROTOCOL §19, docs/rekey.md). A passphrase vault needs `new_passphrase` (its
        database is rekeyed to it at the end: reopen with it); an account or team vault gets a
        new random key. `new_api_key` is the key for the new vault (default: the current one).
        `progress` gets (done, total) while the versions are re-encrypted and pushed.
        Interrupted anywhere, calling it again (with the same new passphrase) finishes it.
        """
        return Rekey(self._session, progress=progress).run(
            new_passphrase=new_passphrase, new_api_key=new_api_key
        )

    def watch(
        self,
        *,
        interval: float | None = None,
        stop: threading.Event | None = None,
        on_report: Callable[[SyncReport], None] | None = None,
        on_status: Callable[[LiveStatus], None] | None = None,
        wake: threading.Event | None = None,
    ) -> Iterator[SyncReport]:
        """Sync live until `stop` is set, yielding each sync's report (docs/live-sync.md).

        A sync runs as soon as the relay's live feed says another device pushed (PROTOCOL
        §15; the long-poll, or the timer alone, where the relay or a proxy offers no
        stream), as soon as this vault changes (a write through this `Vault` between two
        reports, or by another program into its database, seen within about half a second),
        and every `interval` seconds whatever happens (default: the vault's configured
        interval). `on_report` gets each report as it is yielded; `on_status` each change
        of the `LiveStatus` (connected, catching up, offline, ...). A relay that is
        unreachable or rate-limits is retried with backoff; every other error ends the
        watch (`DeviceRevokedError` when the relay revoked this device, `NotLinkedError`
        at once before `link`). `wake`, an event the caller sets after writing to this
        vault through another `Vault` of its own (another thread's connection), makes the
        watch look for that write at once rather than within its check (about half a
        second); the watch clears it.
        """
        every = interval if interval is not None else self._session.config.interval_secs
        live = LiveSync(
            self._session,
            interval=every,
            stop=stop or threading.Event(),
            retry=_transient,
            on_report=on_report,
            on_status=on_status,
            wake=wake,
        )
        yield from live.run()


def _transient(error: SyncError) -> bool:
    """The failures `watch` retries: the relay is away, or asks the device to slow down."""
    return isinstance(error, RelayUnavailableError | RateLimitedError)
