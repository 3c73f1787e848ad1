"""`revert`: take back what one device, source or AI tool wrote (docs/history.md).

Every memory whose current version was written by the selected writer (after `since`)
goes back to the newest kept version written by someone else (or before `since`), is
deleted when the selected writer created it, or is undeleted when the writer deleted
it. The decision for one memory is `plan_memory`, a pure function of its kept versions;
`plan_revert` gathers them, `run_revert` executes the plan in transactions of `BATCH`
memories, each write a new local version (reason `revert`) that the next sync pushes with
a new clock, so it wins on every device. A version a revert wrote is never selected
again: a rerun after a crash finishes the memories left and repeats none.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal

from engram_sync.shared_format.timestamps import parse_rfc3339
from engram_sync.shared_format.vault import Vault

from .history import (
    REVERT,
    Origin,
    Writer,
    current_origin,
    kept_rows,
    replacing,
    write_back,
    written_of,
)
from .store import delete_memory, get_row, named_rows

BATCH: Final = 500  # memories per transaction


@dataclass(frozen=True)
class Selector:
    """Whose writes to take back: every given criterion must hold."""

    device_id: str | None = None
    source: str | None = None
    tool: str | None = None
    since: datetime | None = None

    def __post_init__(self) -> None:
        if self.device_id is None and self.source is None and self.tool is None:
            raise ValueError("say whose writes to revert: a device, a source or a tool")

    def matches(self, writer: Writer) -> bool:
        """Whether `writer` is one of the selected."""
        if self.device_id is not None and writer.device_id != self.device_id:
            return False
        if self.source is not None and writer.source != self.source:
            return False
        if self.tool is not None and writer.tool != self.tool:
            return False
        if self.since is not None:
            at = _instant(writer.at)
            return at is not None and at >= self.since
        return True


def _instant(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return parse_rfc3339(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class KeptVersion:
    """What planning needs of one kept version."""

    version: int
    deleted: bool
    written: Writer
    reason: str  # why it was replaced


Action = Literal["restore", "undelete", "delete"]


@dataclass(frozen=True)
class Step:
    """What reverting one memory does: restore (or undelete) kept `version`, or delete."""

    memory_id: str
    action: Action
    version: int | None = None


@dataclass(frozen=True)
class Unrevertible:
    """A selected memory whose version before the selected writes is no longer kept."""

    memory_id: str
    why: str


def plan_memory(
    memory_id: str, current: Origin, deleted: bool, kept: list[KeptVersion], selector: Selector
) -> Step | Unrevertible | None:
    """The step that takes back the selected writes to one memory (None: nothing to do).

    `current`: who wrote the version held now (`deleted`: it is a deletion); `kept`: its
    kept versions, oldest first (version numbers count up from 1 on this device, so a
    first kept version numbered 1 means nothing of it was pruned)."""
    if current.reason == REVERT or not selector.matches(current.writer):
        return None
    for index in range(len(kept) - 1, -1, -1):
        version = kept[index]
        written_by_revert = index > 0 and kept[index - 1].reason == REVERT
        if written_by_revert or not selector.matches(version.written):
            if version.deleted:
                return None if deleted else Step(memory_id, "delete")
            return Step(memory_id, "undelete" if deleted else "restore", version.version)
    first = kept[0].version if kept else current.version
    if first != 1:
        return Unrevertible(memory_id, "the versions before these writes were pruned")
    return None if deleted else Step(memory_id, "delete")  # the selected writer created it


@dataclass
class RevertPlan:
    """Every step of a revert, and the memories it cannot take back."""

    steps: list[Step] = field(default_factory=list)
    unrevertible: list[Unrevertible] = field(default_factory=list)

    def count(self, action: Action) -> int:
        """How many steps do `action`."""
        return sum(1 for step in self.steps if step.action == action)


def candidates(conn: sqlite3.Connection, selector: Selector, own_device: str) -> list[str]:
    """The memories whose current version may be the selector's (a superset; `plan_memory`
    decides), in a stable order."""
    found: set[str] = set()

    def add(query: str, *params: str) -> None:
        found.update(str(row[0]) for row in conn.execute(query, params))

    if selector.device_id is not None:
        add("SELECT memory_id FROM sync_history WHERE new_by = ?", selector.device_id)
        add("SELECT memory_id FROM sync_known_clocks WHERE device_id = ?", selector.device_id)
        if selector.device_id == own_device:
            add("SELECT id FROM engrams WHERE synced_at IS NULL OR modified_at > synced_at")
            add("SELECT id FROM tombstones")
            add("SELECT memory_id FROM sync_local_deletions")
    elif selector.source is not None:
        add("SELECT memory_id FROM sync_history WHERE new_source = ?", selector.source)
        add("SELECT id FROM engrams WHERE source = ?", selector.source)
    elif selector.tool is not None:
        add("SELECT memory_id FROM sync_history WHERE new_tool = ?", selector.tool)
        add("SELECT id FROM engrams WHERE instr(context, ?) > 0", selector.tool)
    return sorted(found)


def _kept_versions(conn: sqlite3.Connection, memory_id: str) -> list[KeptVersion]:
    return [
        KeptVersion(
            int(row["version"]),
            bool(row["deleted"]),
            written_of(row),
            str(row["reason"]),
        )
        for row in kept_rows(conn, memory_id)
    ]


def plan_revert(conn: sqlite3.Connection, selector: Selector, own_device: str) -> RevertPlan:
    """What a revert of `selector`'s writes would do on this vault (nothing is written)."""
    plan = RevertPlan()
    for memory_id in candidates(conn, selector, own_device):
        origin = current_origin(conn, memory_id, own_device)
        if origin is None:
            continue
        deleted = get_row(conn, memory_id) is None
        decided = plan_memory(memory_id, origin, deleted, _kept_versions(conn, memory_id), selector)
        if isinstance(decided, Step):
            plan.steps.append(decided)
        elif isinstance(decided, Unrevertible):
            plan.unrevertible.append(decided)
    return plan


def run_step(conn: sqlite3.Connection, step: Step, by: Writer, *, own_device: str) -> None:
    """Execute one step as a new local version."""
    if step.action == "delete":
        with replacing(conn, step.memory_id, REVERT, by, own_device=own_device, deletion=True):
            delete_memory(conn, step.memory_id)
        return
    found = named_rows(
        conn,
        "SELECT *, memory_id AS id FROM sync_history"
        " WHERE memory_id = ? AND version = ? AND deleted = 0"
        " ORDER BY seq DESC LIMIT 1",
        (step.memory_id, step.version),
    ).fetchone()
    if found is None:  # pruned since the plan was made: the next run reports it
        return
    write_back(conn, found, REVERT, by, own_device=own_device)


def run_revert(
    vault: Vault,
    steps: list[Step],
    by: Writer,
    *,
    own_device: str,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Execute `steps` in transactions of `BATCH`; returns how many were done."""
    done = 0
    for start in range(0, len(steps), BATCH):
        with vault.transaction() as conn:
            for step in steps[start : start + BATCH]:
                run_step(conn, step, by, own_device=own_device)
        done = min(len(steps), start + BATCH)
        if progress is not None:
            progress(done)
    return done
