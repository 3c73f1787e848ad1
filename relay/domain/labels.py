"""Labels people read in rosters and request lists (PROTOCOL §5 device labels, §14).

A label is shown on other people's screens (`engram-sync devices`, `team pending`),
so it must be text and nothing that acts on a terminal: no control characters
(Unicode Cc: newline, ESC and the C1 range with CSI), no format characters (Cf:
bidirectional overrides, zero-width characters), no line or paragraph separators
(Zl, Zp) and no lone surrogates (Cs). Otherwise one label could draw fake roster
lines or recolour the screen. Our reading of §5, written down in docs/cli.md ("Device labels").
"""

from __future__ import annotations

import unicodedata
from typing import Final

MAX_LABEL_CHARS: Final = 128  # PROTOCOL §5
_NOT_TEXT: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def label_problem(label: str, field: str = "label") -> str | None:
    """Why an already trimmed label is refused (too long, not printable text), or None."""
    if len(label) > MAX_LABEL_CHARS:
        return f"{field} is longer than {MAX_LABEL_CHARS} characters"
    for char in label:
        if unicodedata.category(char) in _NOT_TEXT:
            return (
                f"{field} contains a control or format character (U+{ord(char):04X}); "
                "labels are printable text on one line"
            )
    return None
