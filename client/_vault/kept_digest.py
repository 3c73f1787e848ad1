"""The device's digest, kept up to date instead of recomputed at every check (PROTOCOL §18,
docs/digest.md "Kept on the device"; issue 36).

The fold is order-free (the XOR of the held versions' hashes, and their count), so a
memory's change only takes its old version out and its new one in. How it is kept, and
why a crash cannot leave it wrong (client schema migration 5):

- triggers on every table a memory's held version depends on (the sources of
  `client._vault.held_versions`) note, before the memory's first change since the last
  fold, the version it held then (`sync_digest_dirty`; no device: none), in the same
  transaction as the change, whoever writes it (engram-sync, an Engram tool, a hand edit);
- `fold_changes` takes each noted memory's old version out of the kept value
  (`sync_digest`) and the one it holds now in, and clears the notes, in the caller's
  transaction (a pulled page's, a push batch's, the check's).

So the kept value and the notes together describe the committed rows at every commit.
A full recomputation (`held_versions`) only when the value is missing or invalid
(`kept_digest`), or where the check computes every held version anyway (`verify --deep`,
a mismatch it narrows: `held_and_kept`), which also puts a wrong kept value right.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Final

from engram_sync.shared_format.digest import DIGEST_BYTES, Version, fold, version_hash
from engram_sync.shared_format.vault import Vault

from .held_versions import held_versions

_READ: Final = "SELECT digest, count FROM sync_digest WHERE id = 1"
_WRITE: Final = (
    "INSERT INTO sync_digest (id, digest, count) VALUES (1, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET digest = excluded.digest, count = excluded.count"
)
_NOTED: Final = (
    "SELECT memory_id, device_id, vector_clock, deleted FROM sync_digest_dirty"
    " WHERE device_id IS NOT NULL"
)
_NOW: Final = (
    "SELECT memory_id, device_id, vector_clock, deleted FROM sync_digest_versions"
    " WHERE memory_id IN (SELECT memory_id FROM sync_digest_dirty) AND held"
)
_ANY_NOTED: Final = "SELECT EXISTS (SELECT 1 FROM sync_digest_dirty)"
# `note_changing` from this many memories on: for one, the triggers' notes cost 22 us and
# the two statements 62 (a 30,000-memory vault, its pages cached); for 500 memories not
# cached, 4.4 ms against 2.9
BULK_NOTES: Final = 100
# `note_changing`: the triggers' two statements (client._vault.schema `_noting_triggers`)
# for many memories at once, each note only where the memory has none yet
_NOTE_HELD: Final = (
    "INSERT INTO sync_digest_dirty (memory_id, device_id, vector_clock, deleted)"
    " SELECT memory_id, device_id, vector_clock, deleted FROM sync_digest_versions"
    " WHERE memory_id IN (SELECT value FROM json_each(?)) AND held"
    " AND memory_id NOT IN (SELECT memory_id FROM sync_digest_dirty)"
)
_NOTE_NONE: Final = (
    "INSERT INTO sync_digest_dirty (memory_id) SELECT DISTINCT value FROM json_each(?)"
    " WHERE value NOT IN (SELECT memory_id FROM sync_digest_dirty)"
)
_CLEAR: Final = "DELETE FROM sync_digest_dirty"

Kept = tuple[int, int]  # (XOR of the held versions' hashes, how many)


def changed(kept: Kept, before: Iterable[Version], after: Iterable[Version]) -> Kept:
    """The kept value with the versions `before` taken out and `after` put in (XOR is its
    own inverse; PROTOCOL §18)."""
    value, count = kept
    for v in before:
        value ^= version_hash(v.memory_id, v.device_id, v.vector_clock, v.deleted)
        count -= 1
    for v in after:
        value ^= version_hash(v.memory_id, v.device_id, v.vector_clock, v.deleted)
        count += 1
    return value, count


def valid(row: tuple[object, object] | None) -> Kept | None:
    """The stored row as a kept value, or None when it is missing or not one (32 bytes
    and a count >= 0)."""
    if row is None:
        return None
    digest, count = row
    if not isinstance(digest, bytes) or len(digest) != DIGEST_BYTES:
        return None
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        return None
    return int.from_bytes(digest, "big"), count


def _versions(conn: sqlite3.Connection, query: str) -> list[Version]:
    return [Version(str(m), str(d), int(c), bool(x)) for m, d, c, x in conn.execute(query)]


def _write(conn: sqlite3.Connection, kept: Kept) -> None:
    conn.execute(_WRITE, (kept[0].to_bytes(DIGEST_BYTES, "big"), kept[1]))


def note_changing(conn: sqlite3.Connection, memory_ids: Sequence[str], *, fresh: bool) -> None:
    """Note, before a batch changes them, the versions `memory_ids` hold (what the triggers
    would note row by row; they then find each memory noted and do nothing: issue 36, one
    statement or two for the batch instead of three for each row). `fresh`: the caller
    knows none of them holds a version (no known clock), so only the empty notes are
    written. Fewer than `BULK_NOTES` memories are left to the triggers. Call in the
    transaction of the change, before it."""
    if len(memory_ids) < BULK_NOTES:
        return
    ids = json.dumps(list(memory_ids))
    if not fresh:
        conn.execute(_NOTE_HELD, (ids,))
    conn.execute(_NOTE_NONE, (ids,))


def fold_changes(conn: sqlite3.Connection) -> Kept | None:
    """Fold the noted changes into the kept value; the value, or None when there is no
    valid one (nothing is changed then: `kept_digest` recomputes it). Call inside a
    transaction: the value and the notes it clears commit together."""
    kept = valid(conn.execute(_READ).fetchone())
    if kept is None:
        return None
    if not conn.execute(_ANY_NOTED).fetchone()[0]:
        return kept
    kept = changed(kept, _versions(conn, _NOTED), _versions(conn, _NOW))
    if kept[1] < 0:  # notes that cannot belong to this value: recompute it
        return None
    _write(conn, kept)
    conn.execute(_CLEAR)
    return kept


def rebuild(conn: sqlite3.Connection, held: list[Version]) -> Kept:
    """Set the kept value from every held version (`held`, read in this transaction)."""
    kept = fold(held)
    _write(conn, kept)
    conn.execute(_CLEAR)
    return kept


def kept_digest(vault: Vault) -> Kept:
    """The device's digest, up to date: the kept value with the noted changes folded in,
    recomputed from every held version only when it is missing or invalid."""
    with vault.transaction() as conn:
        kept = fold_changes(conn)
        return kept if kept is not None else rebuild(conn, held_versions(conn))


def held_and_kept(vault: Vault) -> tuple[list[Version], bool]:
    """Every held version, and whether the kept value disagreed with them (it is
    recomputed then): for a check that computes them anyway (`verify --deep`, a mismatch
    it narrows), one transaction so both describe the same rows."""
    with vault.transaction() as conn:
        held = held_versions(conn)
        kept = fold_changes(conn)
        full = fold(held)
        if kept == full:
            return held, False
        _write(conn, full)
        conn.execute(_CLEAR)
        return held, kept is not None
