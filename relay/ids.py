"""Validation of the opaque ids the relay stores (vault, memory and device ids).

No HTTP here: `relay.routes.ids.require_id` turns a refusal into a 400 at the edge."""

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
