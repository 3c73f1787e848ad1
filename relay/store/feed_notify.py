"""The live change feed's SQL (PROTOCOL §15): NOTIFY after commit, heads, re-checks.

`CHANGES` carries '<vault_id> <seq>' once per vault per commit, sent after the data
transaction committed (never inside it). `COMMITS` (ours, docs/live-feed.md "Blobs in the
event") carries a small commit's JSON object `{"vault_id","after","seq","blobs"}` just before
its `CHANGES`, so every process can hand the blobs to its `blobs=1` streams without a query.
`REVOCATIONS` (our addition, docs/live-feed.md) carries '<vault_id>' after a device of
that vault was revoked, so streams of the vault end without any query while they are idle.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import asyncpg
import msgspec

from engram_sync.shared_format.wire import SyncBlob

log = logging.getLogger(__name__)

CHANGES: Final = "engram_vault_changes"
REVOCATIONS: Final = "engram_vault_revocations"
COMMITS: Final = "engram_vault_commits"

# Which commits carry their blobs (docs/live-feed.md "Blobs in the event"): at most this
# many blobs of at most this many ciphertext characters together, so that the NOTIFY
# payload stays under PostgreSQL's 8,000 bytes (checked again on the encoded payload).
INLINE_MAX_BLOBS: Final = 8
INLINE_MAX_CIPHERTEXT: Final = 6_000
MAX_NOTIFY_PAYLOAD: Final = 7_900

# One statement, the notifications in array order: a vault's COMMITS before its CHANGES.
_NOTIFY = "SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) AS u(c, p)"


@dataclass(frozen=True)
class Commit:
    """What one commit did to one vault: its sequence went from `after` to `seq`; `blobs`
    is the JSON array of the blobs it wrote (with their `seq`, ordered by it, as a cursor
    pull from `after` gives them), or None for a commit too large to carry them."""

    vault_id: str
    after: int
    seq: int
    blobs: bytes | None = None


def encode_blobs(written: Sequence[SyncBlob]) -> bytes | None:
    """The JSON array of a commit's blobs, or None when they are too many or too large
    to travel in the feed (the devices pull them)."""
    if len(written) > INLINE_MAX_BLOBS:
        return None
    if sum(len(b.ciphertext) for b in written) > INLINE_MAX_CIPHERTEXT:
        return None
    return msgspec.json.encode(written)


class _CommitNote(msgspec.Struct, frozen=True):
    """The COMMITS payload (docs/live-feed.md "Channels and payloads"): a JSON object, so
    no vault id (which may hold spaces, brackets, quotes: relay.ids) can be read as another
    field; it ends with `}`, which an older relay's reader (space-separated fields, the
    last a JSON array) refuses instead of misreading."""

    vault_id: str
    after: int
    seq: int
    blobs: msgspec.Raw


class _ReadNote(msgspec.Struct, frozen=True):
    """The same payload as read back: the blobs validated against the wire type."""

    vault_id: str
    after: int
    seq: int
    blobs: list[SyncBlob]


_NOTE_ENCODER: Final = msgspec.json.Encoder()
_NOTE_DECODER: Final = msgspec.json.Decoder(_ReadNote)


def commit_payload(commit: Commit) -> str | None:
    """The COMMITS payload of a commit, or None when it has no blobs or would not fit
    PostgreSQL's NOTIFY payload (the devices then pull, as for a large commit)."""
    if commit.blobs is None:
        return None
    note = _CommitNote(commit.vault_id, commit.after, commit.seq, msgspec.Raw(commit.blobs))
    payload = _NOTE_ENCODER.encode(note)
    return payload.decode() if len(payload) <= MAX_NOTIFY_PAYLOAD else None


def parse_commit(payload: str) -> Commit | None:
    """A COMMITS payload back into its commit, or None when it is not one of ours (an older
    relay's payload during a rolling upgrade, or anything malformed). The blobs are decoded
    as `SyncBlob`s and encoded again, never passed on as the bytes received: each must be
    of the commit's vault, with a `seq` in (`after`, `seq`], in ascending order."""
    try:
        note = _NOTE_DECODER.decode(payload)
    except msgspec.DecodeError:
        return None
    if not note.vault_id or not 0 <= note.after < note.seq or not note.blobs:
        return None
    if len(note.blobs) > INLINE_MAX_BLOBS:
        return None
    at = note.after
    for blob in note.blobs:
        if blob.vault_id != note.vault_id or not isinstance(blob.seq, int):
            return None
        if not at < blob.seq <= note.seq:
            return None
        at = blob.seq
    return Commit(note.vault_id, note.after, note.seq, msgspec.json.encode(note.blobs))


async def announce(conn: asyncpg.Connection | asyncpg.Pool, commits: Sequence[Commit]) -> None:
    """One NOTIFY per vault (PROTOCOL §15), and one COMMITS before it for a small commit,
    in one statement outside any transaction.

    A failure is logged, never raised: the push it follows has committed, and a device
    that misses the hint still gets the blobs at its next pull (the cursor is the truth)."""
    if not commits:
        return
    channels: list[str] = []
    payloads: list[str] = []
    for commit in sorted(commits, key=lambda c: c.vault_id):
        carried = commit_payload(commit)
        if carried is not None:
            channels.append(COMMITS)
            payloads.append(carried)
        channels.append(CHANGES)
        payloads.append(f"{commit.vault_id} {commit.seq}")
    try:
        await conn.execute(_NOTIFY, channels, payloads)
    except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError) as exc:
        log.warning(
            "change notification failed: %s",
            type(exc).__name__,
            extra={"vaults": len(commits), "error": type(exc).__name__},
        )


async def announce_revocation(conn: asyncpg.Connection | asyncpg.Pool, vault_id: str) -> None:
    """Tell every relay process that a device of `vault_id` was revoked (after commit);
    a failure is logged: a revoked device's pulls are refused anyway (PROTOCOL §10)."""
    try:
        await conn.execute("SELECT pg_notify($1, $2)", REVOCATIONS, vault_id)
    except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError) as exc:
        log.warning("revocation notification failed: %s", type(exc).__name__)


async def vault_head(pool: asyncpg.Pool, vault_id: str) -> int:
    """The vault's sequence now (0 for a vault nobody pushed to)."""
    async with pool.acquire() as conn:
        seq = await conn.fetchval("SELECT seq FROM vaults WHERE vault_id = $1", vault_id)
    return int(seq or 0)


async def vault_heads(conn: asyncpg.Connection, vault_ids: Sequence[str]) -> dict[str, int]:
    """The sequences of several vaults in one query (those that exist)."""
    rows = await conn.fetch(
        "SELECT vault_id, seq FROM vaults WHERE vault_id = ANY($1::text[])", list(vault_ids)
    )
    return {r["vault_id"]: int(r["seq"]) for r in rows}


async def still_allowed(
    pool: asyncpg.Pool, vault_id: str, device_id: str | None, key_hash: bytes | None
) -> bool:
    """False once the stream's device was revoked in the vault (PROTOCOL §10, §15), or its
    minted key (`key_hash`) was; one query."""
    async with pool.acquire() as conn:
        revoked: bool = await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM devices WHERE vault_id = $1 AND device_id = $2"
            " AND revoked_at IS NOT NULL)"
            " OR EXISTS (SELECT 1 FROM api_keys WHERE key_hash = $3 AND revoked_at IS NOT NULL)",
            vault_id,
            device_id,
            key_hash,
        )
    return not revoked
