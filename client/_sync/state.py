"""This device's sync progress: `sync_state.json` (PROTOCOL §9).

The pull cursor is written after a page has been applied, so a restart resumes
instead of re-downloading. It belongs to one (relay, vault) pair: pointing the
vault at another relay or vault id starts from cursor 0.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

import msgspec

from .._atomic import parse_json, write_json_atomic
from .own_pushes import MAX_OWN_SKIPS, OwnSkip

STATE_FILE: Final = "sync_state.json"
MAX_SKIPPED_KEPT: Final = 200


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _own_skips(value: Any) -> list[OwnSkip]:
    entries = value if isinstance(value, list) else []
    return [skip for entry in entries if (skip := OwnSkip.from_json(entry)) is not None]


@dataclass
class SkippedBlob:
    """A pulled blob that failed verification or decoding: never applied (PROTOCOL §3).

    `keys`: where the keys it failed under came from (client._vault.vault_key_store.key_source; None
    in a record written before issue 35). Anti-entropy fetches it again once this device's
    keys come from elsewhere (PROTOCOL §8: a blob this device cannot open *yet*)."""

    memory_id: str
    device_id: str
    vector_clock: int
    reason: str
    seen_at: str
    keys: str | None = None


@dataclass
class RetiredHint:
    """The relay said this vault was retired (PROTOCOL §19): a 410 `vault_retired` on a push
    (`source` "push") or a pull ("pull", also a pull's `retired` field) or the live feed's
    `event: retired` ("events"). Only a hint: the device stops pushing to the vault and keeps
    every unpushed edit; it switches to `successor` only with a key it obtained itself, and
    only once `statement` (the successor statement, with the `stated_at` it covers)
    verifies under the old vault's hmac key (client._flows.successor)."""

    vault_id: str
    successor: str | None
    erase_after: str | None
    source: str
    seen_at: str
    statement: str | None = None
    stated_at: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> RetiredHint | None:
        """The hint kept in sync_state.json; None for anything else (a hand-edited file)."""
        if not isinstance(value, dict) or not isinstance(value.get("vault_id"), str):
            return None
        return cls(
            vault_id=value["vault_id"],
            successor=_text_or_none(value.get("successor")),
            erase_after=_text_or_none(value.get("erase_after")),
            source=str(value.get("source", "")),
            seen_at=str(value.get("seen_at", "")),
            statement=_text_or_none(value.get("statement")),
            stated_at=_text_or_none(value.get("stated_at")),
        )


@dataclass
class SyncState:
    """What survives between runs."""

    path: Path
    server_url: str | None = None
    vault_id: str | None = None
    cursor: int = 0
    last_sync_at: str | None = None
    last_error: str | None = None
    revoked: bool = False
    # PROTOCOL §17: the relay generation the cursor belongs to, and whether a full re-pull
    # (after a restore or resync_required) is under way; it restarts from 0 until done.
    generation: str | None = None
    full_pull: bool = False
    # issue 17: the first pull after linking to a new (relay, vault) starts from 0 and ends
    # by queueing every version the new vault lacks (the old link's pushes do not count)
    link_pull: bool = False
    skipped: list[SkippedBlob] = field(default_factory=list)
    oversized: list[str] = field(default_factory=list)
    # issue 15: the cursor moves past this device's own pushes (client._sync.own_pushes)
    own_skips: list[OwnSkip] = field(default_factory=list)
    # PROTOCOL §19: the relay's word that the linked vault was retired (None: it is live), and
    # the vault this device synced before it switched to a successor (said once, then kept)
    retired: RetiredHint | None = None
    rekeyed_from: str | None = None

    @classmethod
    def load(cls, vault_dir: Path) -> SyncState:
        """Read the state file (a missing file is a fresh state)."""
        path = vault_dir / STATE_FILE
        if not path.exists():
            return cls(path=path)
        raw = path.read_bytes()
        data: dict[str, Any] = parse_json(raw, path)
        state = cls(
            path=path,
            server_url=data.get("server_url"),
            vault_id=data.get("vault_id"),
            cursor=int(data.get("cursor", 0)),
            last_sync_at=data.get("last_sync_at"),
            last_error=data.get("last_error"),
            revoked=bool(data.get("revoked", False)),
            generation=_text_or_none(data.get("generation")),
            full_pull=bool(data.get("full_pull", False)),
            link_pull=bool(data.get("link_pull", False)),
            skipped=[SkippedBlob(**s) for s in data.get("skipped", [])],
            oversized=list(data.get("oversized", [])),
            own_skips=_own_skips(data.get("own_skips")),
            retired=RetiredHint.from_json(data.get("retired")),
            rekeyed_from=_text_or_none(data.get("rekeyed_from")),
        )
        state._on_disk = state._payload()  # what the file holds, as `save` would write it
        state._raw = raw
        return state

    def refresh(self) -> None:
        """Read the file again (another process may have synced since this was loaded).
        When it still holds the bytes this object last read or wrote, and this object has
        no change it did not save, there is nothing to take: nothing is parsed (issue 36:
        the parse was about 0.2 ms of every sync)."""
        raw = getattr(self, "_raw", None)
        if raw is not None and self._payload() == getattr(self, "_on_disk", None):
            with contextlib.suppress(OSError):
                if self.path.read_bytes() == raw:
                    return
        fresh = SyncState.load(self.path.parent)
        for name, value in vars(fresh).items():
            setattr(self, name, value)

    def bind(self, server_url: str, vault_id: str) -> None:
        """Use this state for (server, vault); a different pair restarts from cursor 0, and
        its first pull queues everything the new vault lacks (`link_pull`, issue 17)."""
        if (self.server_url, self.vault_id) != (server_url, vault_id):
            self.server_url, self.vault_id, self.cursor = server_url, vault_id, 0
            self.revoked = False
            self.generation, self.full_pull, self.link_pull = None, False, True
            self.own_skips = []
            self.retired = None
            self.save()

    def relinked(self) -> None:
        """`link` ran again: the relay's word that this device is revoked is dropped (the
        next sync asks again, client._sync.revocation)."""
        self.revoked = False
        self.save()

    def new_device_id(self) -> None:
        """The device took a new id (`Device.renew_identity`): the moves past the old id's
        own pushes name the old id, so they are forgotten (client._sync.own_pushes)."""
        self.own_skips = []
        self.save()

    def record_skipped(self, skipped: SkippedBlob) -> None:
        """Remember a skipped blob for `status` (the newest MAX_SKIPPED_KEPT)."""
        self.skipped.append(skipped)
        del self.skipped[:-MAX_SKIPPED_KEPT]

    def forget_skipped(self, memory_id: str, device_id: str, vector_clock: int) -> None:
        """A skipped version verified after all (fetched again under other keys)."""
        self.skipped = [
            s
            for s in self.skipped
            if (s.memory_id, s.device_id, s.vector_clock) != (memory_id, device_id, vector_clock)
        ]

    def record_own_skip(self, skip: OwnSkip) -> None:
        """Remember a move past our own pushes (the newest MAX_OWN_SKIPS)."""
        self.own_skips.append(skip)
        del self.own_skips[:-MAX_OWN_SKIPS]

    def save(self) -> None:
        """Persist atomically; a state equal to the one last read or written is not written
        again (a sync saves at several points, most of which changed nothing: each write
        is two fsyncs, a large part of applying one memory from the live feed)."""
        payload = self._payload()
        if payload == getattr(self, "_on_disk", None):
            return
        # not `durable`: a crash may leave the previous file, an older consistent state
        # (PROTOCOL §9: a cursor behind committed rows is pulled again as known versions;
        # §17: an older generation re-checks the relay), never an empty one; one fsync
        # instead of two in every sync (issue 36, docs/benchmarks.md)
        self._raw = write_json_atomic(self.path, payload, durable=False)
        self._on_disk = payload

    def _payload(self) -> dict[str, Any]:
        """The file's content: every field but `path`, nested dataclasses as dicts (what
        `dataclasses.asdict` gives, in 1% of its time: with 64 `own_skips` its deep copy
        took about 0.4 ms of each save and each refresh, issue 36)."""
        payload: dict[str, Any] = msgspec.to_builtins(
            {f.name: getattr(self, f.name) for f in _FIELDS if f.name != "path"}
        )
        return payload


_FIELDS: Final = fields(SyncState)
