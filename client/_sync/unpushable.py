"""Memories a push sets aside instead of sending (issue 31).

The relay refuses a whole push when one blob is structurally invalid (PROTOCOL §6 step
1): a memory whose id breaks the id rule (an old vault's row, another tool writing
`engrams.db`) would make every push of every batch it falls in a 400, sync after sync.
So the push checks each id with the relay's own rule (`shared_format.ids`) before
sealing, and a 400 `invalid_blob` naming a blob by its index (a relay with a stricter
rule) drops that blob and sends the rest again. Either way the memory stays in the vault,
unpushed and untouched (nothing is deleted), and the sync names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from engram_sync.shared_format.ids import check_id

SHOWN_ID_CHARS: Final = 80  # of an id quoted in a message


@dataclass(frozen=True)
class Unpushable:
    """A memory (or deletion) this push kept local, and why."""

    memory_id: str
    reason: str


def shown_id(memory_id: str) -> str:
    """An id as one line of text: control characters escaped, long ids cut."""
    text = ascii(memory_id[:SHOWN_ID_CHARS])
    return text if len(memory_id) <= SHOWN_ID_CHARS else text + "…"


def id_refusal(memory_id: str) -> Unpushable | None:
    """The refusal the relay would answer for this id (PROTOCOL §6 step 1), None when the
    id is valid."""
    problem = check_id(memory_id, "memory id")
    if problem is None:
        return None
    return Unpushable(memory_id, f"{problem}, which no relay accepts (PROTOCOL §6 step 1)")


def refused_index(index: int | None, sent: int) -> int | None:
    """The blob a 400 `invalid_blob` names, when it names one of the `sent` blobs; None
    otherwise (the answer cannot be acted on: the push fails as before)."""
    if index is None or not 0 <= index < sent:
        return None
    return index
