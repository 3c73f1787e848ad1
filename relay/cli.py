"""The `engram-relay` command (issue 3 builds it out)."""

from __future__ import annotations

import sys


def main() -> None:
    """Entry point of `engram-relay`."""
    print("engram-relay: not implemented yet (the relay lands with issue 3)", file=sys.stderr)
    sys.exit(2)
