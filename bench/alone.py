"""One benchmark module run alone (`python -m bench.mcp`, `bench.history`,
`bench.web_vault`, `bench.client_e2e`): its own embedded PostgreSQL and relay process, the
result as JSON, then a PASS/FAIL line per target."""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.targets import Target

#: measure(scratch, relay url, relay key, log) -> the module's section
Measure = Callable[[Path, str, str, Callable[[str], None]], dict[str, Any]]


def log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_alone(measure: Measure, targets: Callable[[dict[str, Any]], Sequence[Target]]) -> int:
    """Measure on a fresh database and relay process, print the JSON and the verdicts."""
    from bench.database import BenchDatabase
    from bench.relay_process import RelayProcess

    log_to_stderr(f"load average at the start {os.getloadavg()}")
    with BenchDatabase() as db:
        key = "bench-" + secrets.token_urlsafe(24)
        with RelayProcess(db.url, key, Path(db.scratch) / "relay.log") as relay:
            log_to_stderr(f"relay pid {relay.pid}")
            result = measure(Path(db.scratch), relay.url, relay.key, log_to_stderr)
    print(json.dumps(result, indent=2))
    for target in targets(result):
        verdict = target.as_json()
        print(f"{verdict['verdict']}  {target.name}: {target.value:.3f} "
              f"(target {verdict['target']}) {target.detail}")  # fmt: skip
    return 0
