"""Issue 36: `list` and `search` with the key agent on a vault of 5,000 memories (figure 16's
agent, a bigger vault): the wall time of each command as a subprocess, the agent holding the
keys and answering it (client._cli.fast), JSON out. A page of search results, every memory
as `list --json`, and a search matching every memory as JSON. Runs interleaved."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

from bench.agent import EXE, PASSPHRASE, _env, _run
from bench.corpus import project, sentence, tags
from bench.stats import summary
from engram_sync.client._session import VaultSession
from engram_sync.client._vault import store as local_store

MEMORIES: Final = 5_000
QUICK_MEMORIES: Final = 300
RUNS: Final = 15
QUICK_RUNS: Final = 2
WORD: Final = "engram"  # every memory's content ends with it: a search that finds them all
COMMANDS: Final = {
    "search_page_json": ("search", "the", "--json"),  # the default page of 20
    "list_json": ("list", "--json"),
    "search_all_json": ("search", WORD, "--json", "--limit", str(MEMORIES)),
}


def _fill(vault: Path, memories: int) -> None:
    rng = random.Random(36)  # noqa: S311 - test data, not crypto
    with (
        VaultSession.open(vault, PASSPHRASE, create=True) as session,
        session.vault.transaction() as conn,
    ):
        for _ in range(memories):
            text = f"{sentence(rng)} the {WORD}"
            local_store.add_memory(conn, text, tags=tags(rng), project=project(rng))


def measure(scratch: Path, *, quick: bool) -> dict[str, Any]:
    """Each command `runs` times, interleaved, with the agent answering."""
    memories, runs = (QUICK_MEMORIES, QUICK_RUNS) if quick else (MEMORIES, RUNS)
    root = scratch / "agent-reads-bench"
    (root / "home").mkdir(parents=True, exist_ok=True)
    # the agent's socket lives in XDG_RUNTIME_DIR: a short folder of its own, since a
    # socket's path is bounded (108 bytes) and `scratch` may be a deep test folder
    runtime = tempfile.mkdtemp(prefix="es-ar-")
    with_pass, without_pass = _env(root, True), _env(root, False)
    with_pass["XDG_RUNTIME_DIR"] = without_pass["XDG_RUNTIME_DIR"] = runtime
    if not (root / "vault" / "engrams.db").exists():
        _fill(root / "vault", memories)
    _run([EXE, "unlock", "--timeout", "600"], with_pass)
    figures: dict[str, list[float]] = {name: [] for name in (*COMMANDS, "python_startup")}
    sizes: dict[str, int] = {}
    try:
        for name, command in COMMANDS.items():  # warm-up, and what each answers
            done = subprocess.run(  # noqa: S603 - our executable, fixed argv
                [EXE, *command], env=without_pass, capture_output=True, check=True, timeout=300
            )
            sizes[name] = len(done.stdout)
        for _ in range(runs):
            for name, command in COMMANDS.items():
                figures[name].append(_run([EXE, *command], without_pass))
            # what any command pays before it runs, beside them (bench.agent's figure)
            figures["python_startup"].append(_run([sys.executable, "-c", "pass"], without_pass))
    finally:
        _run([EXE, "lock"], without_pass)
        shutil.rmtree(runtime, ignore_errors=True)
    return {
        "memories": memories,
        "runs": runs,
        **{f"{name}_ms": summary(values, "ms") for name, values in figures.items()},
        "output_bytes": sizes,
    }
