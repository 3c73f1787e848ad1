"""Values transcribed by hand from VAULT.md, so the tests do not loop over the code's own lists.

A source dropped from the code (or added to it) then fails a test instead of dropping its test.
"""

from __future__ import annotations

from typing import Final

# VAULT §3: the CHECK list of engrams.source, in VAULT.md's order.
ENGRAM_SOURCES: Final = (
    "interaction",
    "sensor",
    "consolidation",
    "imagined",
    "chat",
    "slack",
    "discord",
    "telegram",
    "window",
    "mic",
    "agent",
    "research",
    "system",
    "user",
    "observation",
    "ai-session",
    "ai-tool",
)
