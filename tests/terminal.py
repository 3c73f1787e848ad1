"""Reading what a process wrote to a pseudo-terminal (the CLI and relay terminal tests)."""

from __future__ import annotations

import os


def read_until_closed(master: int) -> bytes:
    """Every byte written to a pseudo-terminal until its other end is closed."""
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        seen += chunk
    return seen
