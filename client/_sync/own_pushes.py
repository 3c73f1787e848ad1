"""A device does not download its own pushes again (issue 15; docs/live-sync.md).

PROTOCOL §9: every accepted blob takes the next number of the vault's sequence inside the
push transaction, and the push answer's `cursor` is the vault's sequence after the commit.
So when a push of ours that the relay accepted `k` blobs of answers `cursor == c + k`, where
`c` is the cursor this device had pulled to, the sequence numbers c+1..c+k are exactly our
own blobs and nothing else was committed in between: the device moves its cursor to c+k
without pulling them back. Any other answer (another device committed in between, counts
that do not add up, no cursor at all) leaves the cursor alone: the next pull fetches the
range, our own versions come back as stale, and nothing is missed. When in doubt, pull.

A relay that lies here could make the device skip another device's blobs, which a lying
relay could already do by leaving them out of a page. Part of such a lie shows later: our
own blob, which the answer placed at or below c+k, arrives in a page pulled from c+k or
beyond. Every move is remembered (`OwnSkip`, the last `MAX_OWN_SKIPS` in sync_state.json)
so that a pull that sees this rewinds the cursor to where the move began and pulls the
range after all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from engram_sync.shared_format.wire import PushResponse, SyncBlob

MAX_OWN_SKIPS: Final = 64
MAX_CURSOR: Final = 2**63 - 1


@dataclass(frozen=True)
class OwnSkip:
    """The cursor moved from `start` to `end` past our own blobs with these clocks."""

    start: int
    end: int
    first_clock: int
    last_clock: int

    @classmethod
    def from_json(cls, value: Any) -> OwnSkip | None:
        """An entry of sync_state.json, or None when it is not four ordered integers."""
        if not isinstance(value, dict):
            return None
        fields: list[int] = []
        for name in ("start", "end", "first_clock", "last_clock"):
            item = value.get(name)
            if not isinstance(item, int) or isinstance(item, bool) or item < 0:
                return None
            fields.append(item)
        start, end, first, last = fields
        if start >= end or first > last:
            return None
        return cls(start, end, first, last)

    def refuted_by(self, blob: SyncBlob, device_id: str, asked: int) -> bool:
        """Whether `blob`, in a page pulled from `asked`, proves the move was wrong: one of
        the blobs the move stepped over arrives above the cursor it moved to."""
        return (
            asked >= self.end
            and blob.device_id == device_id
            and self.first_clock <= blob.vector_clock <= self.last_clock
        )


def own_commit_end(response: PushResponse, *, cursor: int, sent: Sequence[str]) -> int | None:
    """The cursor past our own commit when the answer shows nothing else was committed
    since `cursor` (the device's pulled cursor), else None (pull as usual)."""
    end = response.cursor
    if not isinstance(end, int) or end > MAX_CURSOR:
        return None
    sent_ids = set(sent)
    rejected = set(response.rejected)
    if len(sent_ids) != len(sent) or not rejected <= sent_ids:
        return None  # a rejection of an id we did not send: the answer does not add up
    accepted = len(sent_ids - rejected)
    if accepted == 0 or response.accepted != accepted:
        return None
    if end != cursor + accepted:
        return None  # someone else committed in between (or the numbers are off): pull
    return end


def refuted_start(
    skips: Sequence[OwnSkip], blobs: Sequence[SyncBlob], device_id: str, asked: int
) -> int | None:
    """The cursor to pull again from when a page pulled from `asked` refutes a move."""
    starts = [
        skip.start for skip in skips for blob in blobs if skip.refuted_by(blob, device_id, asked)
    ]
    return min(starts) if starts else None
