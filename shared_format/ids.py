"""The rule for the opaque ids a relay stores (vault, memory and device ids), PROTOCOL §6
step 1: one function for both sides. The relay refuses a push holding an invalid id as a
whole (`relay.domain.push_rules`, a 400 at its edge); the client applies the same rule before it
writes an id into a vault (import) and before it seals one (its push sets such a memory
aside instead of sending a batch the relay must refuse, issue 31)."""

from __future__ import annotations

import re
from typing import Final

MAX_ID_CHARS: Final = 256  # PROTOCOL §6 step 1
# PostgreSQL text cannot hold NUL, and control characters in ids only cause harm
# downstream (logs, terminals): they are refused as structurally invalid (our reading of §6).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_id(value: str, name: str) -> str | None:
    """The reason an id is invalid (empty, > 256 characters, control characters), or None."""
    if not value:
        return f"{name} is empty"
    if len(value) > MAX_ID_CHARS:
        return f"{name} is longer than {MAX_ID_CHARS} characters"
    if _CONTROL.search(value):
        return f"{name} contains control characters"
    return None


def all_valid(values: set[str]) -> bool:
    """True when `check_id` finds nothing wrong with any of `values` (issue 36: a push's
    distinct ids in one search, not one call each; on False, `check_id` names the one)."""
    return (
        "" not in values
        and max(map(len, values), default=0) <= MAX_ID_CHARS
        and not _CONTROL.search("".join(values))
    )
