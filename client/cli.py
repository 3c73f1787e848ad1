"""The `engram-sync` command (issue 4 builds it out)."""

from __future__ import annotations

import sys


def main() -> None:
    """Entry point of `engram-sync`."""
    print("engram-sync: not implemented yet (the client lands with issue 4)", file=sys.stderr)
    sys.exit(2)
