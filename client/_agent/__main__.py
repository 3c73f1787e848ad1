"""`python -m engram_sync.client._agent [--timeout SECONDS]`: the agent process, started
detached by `engram-sync unlock` (client._agent.control.start_agent)."""

from __future__ import annotations

import argparse
import os
import sys

from .server import DEFAULT_IDLE_TIMEOUT_S, run


def _report(word: str) -> None:
    """Tell the starting `unlock` (our stdout is its pipe), then let go of that pipe."""
    sys.stdout.write(word + "\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engram_sync.client._agent")
    parser.add_argument("--timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S)
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    return run(args.timeout, _report)


if __name__ == "__main__":
    sys.exit(main())
