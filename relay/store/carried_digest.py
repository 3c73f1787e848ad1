"""Ours (issue 36; docs/digest.md "Carried in push and pull answers"): the vault's §18
digest and count, at the sequence they describe, carried in a push answer and in a cursor
pull's last page, so a device's end-of-sync check needs no `GET /digest` of its own.

Each is read where the answer's other values come from, so it describes exactly the vault
at its sequence: a push's from the group's decision once its transaction committed (the
digest, count and `seq` written by one statement under the vault lock, PROTOCOL §6, §18),
a pull page's from the vault row its one statement reads (one snapshot, §9), and only when
the page ends at the vault's head. The device checks it as it checks a digest answer
(client._sync.anti_entropy). Sent only to a request that asks (`?digest=1`, feature
`digest-carried`): every other answer stays the §5/§9 core, byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from msgspec import UNSET, UnsetType

from engram_sync.shared_format.b64 import b64encode_std
from engram_sync.shared_format.wire import VaultDigest


@dataclass(frozen=True, slots=True)
class CarriedDigest:
    """The vault's §18 digest (32 bytes) and count at sequence `cursor`."""

    cursor: int
    count: int
    digest: bytes


# `relay.store.sync.PULL_PAGE`'s two columns of it: on the page's last row only when that
# row is the vault's head (its last blob, or the empty page's row of NULL blob columns), so
# a page of 1,000 carries 32 bytes, not 32,000. A page whose last blob is below the head
# (compacted tombstones above it) carries none: the device then asks `GET /digest`.
_AT_HEAD: Final = "p.seq IS NULL OR p.seq = v.seq"
PULL_COLUMNS: Final = (
    f"CASE WHEN {_AT_HEAD} THEN v.digest END AS carried_digest,"
    f" CASE WHEN {_AT_HEAD} THEN v.live_blobs + v.tombstones END AS carried_count"
)


def carried_by_page(last_row: Any, head: int, *, has_more: bool) -> CarriedDigest | None:
    """What a pull page carries, from the last row `PULL_PAGE` returned: None on a page
    with more after it, or one that does not end at the head."""
    if has_more or last_row["carried_digest"] is None:
        return None
    return CarriedDigest(head, int(last_row["carried_count"]), bytes(last_row["carried_digest"]))


def on_wire(carried: CarriedDigest | None) -> VaultDigest | UnsetType:
    """The answer's `vault_digest` (absent when there is none)."""
    if carried is None:
        return UNSET
    return VaultDigest(carried.cursor, carried.count, b64encode_std(carried.digest))
