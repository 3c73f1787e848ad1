"""Figure 16, unlock once (issue 17, docs/agent.md): the wall time of one `engram-sync list` of a
one-memory vault as a subprocess, with the key agent holding the vault's keys (the entry
point's fast path: the agent answers `list` itself, client._cli.fast), the normal CLI with
the agent's keys (what the fast path skips: the CLI's imports and a SQLCipher open), and
without the agent (ENGRAM_PASSPHRASE: Argon2id of VAULT.md §2 and PROTOCOL §2 in the
command), and, apart,
what any command pays before it runs: the interpreter's start and the CLI's imports, and
what opening the vault with the agent's key costs by itself (SQLCipher 4 derives the page
key from the VAULT §2 key string with PBKDF2-HMAC-SHA512 on every open; CPU, in-process).

The runs of the four measurements are interleaved, so a burst of load on the shared
machine hits them alike. The agent is started and stopped here, in a runtime directory of
its own.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

from bench.stats import summary
from engram_sync.shared_format.vault import passphrase_vault_key, sqlcipher, vault_salt16

PASSPHRASE: Final = "engram bench agent passphrase: correct horse battery staple"  # noqa: S105
EXE: Final = str(Path(sys.executable).parent / "engram-sync")
COMMAND: Final = ("list",)
CLI_MODULE: Final = "engram_sync.client._cli.main"
#: The normal CLI, without the entry point's fast path (it takes the agent's keys).
CLI_ONLY: Final = f"import sys; sys.argv[0] = 'engram-sync'; from {CLI_MODULE} import main; main()"
#: The fast path alone: exit 99 when the agent did not answer.
FAST_ONLY: Final = (
    "import sys; from engram_sync.client._cli.fast import fast_path; "
    "code = fast_path(sys.argv[1:]); sys.exit(99 if code is None else code)"
)
RUNS: Final = 15  # interleaved rounds of a full run
QUICK_RUNS: Final = 2  # and of `python -m bench --quick` (tests/bench)


def _env(root: Path, passphrase: bool, runtime: str = "run") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(
        HOME=str(root / "home"),
        XDG_CONFIG_HOME=str(root / "home" / "config"),
        XDG_RUNTIME_DIR=str(root / runtime),
        ENGRAM_VAULT=str(root / "vault"),
    )
    if passphrase:
        env["ENGRAM_PASSPHRASE"] = PASSPHRASE
    return env


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(argv: list[str], env: dict[str, str], cpu: list[float] | None = None) -> float:
    """Wall milliseconds of one subprocess, which must succeed; its CPU milliseconds (user +
    system, all its threads) appended to `cpu`: on a loaded machine the steadier figure."""
    cpu_before = _children_cpu_s()
    started = time.perf_counter()
    done = subprocess.run(  # noqa: S603 - our interpreter and executable, fixed argv
        argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=False, timeout=300
    )
    if done.returncode != 0:  # what the command said, not only its exit status
        said = done.stderr.decode(errors="replace").strip()[-500:]
        raise RuntimeError(f"{' '.join(argv[1:])} exited {done.returncode}: {said}")
    wall_ms = (time.perf_counter() - started) * 1000
    if cpu is not None:
        cpu.append((_children_cpu_s() - cpu_before) * 1000)
    return wall_ms


def _output(argv: list[str], env: dict[str, str]) -> bytes:
    done = subprocess.run(  # noqa: S603 - our interpreter and executable, fixed argv
        argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=True, timeout=300
    )
    return done.stdout + b"\0" + done.stderr


def _vault_open_cpu_ms(vault_dir: Path) -> float:
    """CPU milliseconds of one keyed SQLCipher open and first read with the database key
    (VAULT §2), what every command pays with or without the agent."""
    key = passphrase_vault_key(PASSPHRASE, vault_salt16(vault_dir))
    started = time.process_time()
    conn = sqlcipher.try_key(vault_dir / "engrams.db", key)
    spent = (time.process_time() - started) * 1000
    if conn is None:
        raise RuntimeError("the bench vault's key did not open it")
    conn.close()
    return spent


def measure(scratch: Path, runs: int) -> dict[str, Any]:
    """`runs` interleaved rounds of: interpreter start, CLI imports, the command with the
    agent (fast path), the normal CLI with the agent's keys, the command with the passphrase
    and no agent."""
    root = scratch / "agent-bench"
    (root / "home").mkdir(parents=True, exist_ok=True)
    (root / "run").mkdir(mode=0o700, exist_ok=True)
    (root / "run-no-agent").mkdir(mode=0o700, exist_ok=True)
    with_pass, without_pass = _env(root, True), _env(root, False)
    no_agent = _env(root, True, "run-no-agent")  # a runtime directory no agent listens in
    if not (root / "vault" / "engrams.db").exists():
        _run([EXE, "init"], with_pass)
        _run([EXE, "add", "one memory"], with_pass)
    _run([EXE, "unlock", "--timeout", "600"], with_pass)
    names = ("python", "imports", "agent", "agent_cli", "prompt")
    figures: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in (*names, "vault_open")}
    try:
        _run([EXE, *COMMAND], without_pass)  # warm-up: file caches, the agent's first answer
        _run([EXE, *COMMAND], no_agent)
        # the figure is the fast path's: the agent must answer, with the CLI's own bytes
        _run([sys.executable, "-c", FAST_ONLY, *COMMAND], without_pass)
        if _output([EXE, *COMMAND], without_pass) != _output(
            [sys.executable, "-c", CLI_ONLY, *COMMAND], without_pass
        ):
            raise RuntimeError("the fast path and the CLI print different output")
        for _ in range(runs):
            figures["python"].append(
                _run([sys.executable, "-c", "pass"], without_pass, cpu["python"])
            )
            figures["imports"].append(
                _run([sys.executable, "-c", f"import {CLI_MODULE}"], without_pass, cpu["imports"])
            )
            figures["agent"].append(_run([EXE, *COMMAND], without_pass, cpu["agent"]))
            figures["agent_cli"].append(
                _run([sys.executable, "-c", CLI_ONLY, *COMMAND], without_pass, cpu["agent_cli"])
            )
            figures["prompt"].append(_run([EXE, *COMMAND], no_agent, cpu["prompt"]))
            cpu["vault_open"].append(_vault_open_cpu_ms(root / "vault"))
    finally:
        _run([EXE, "lock"], without_pass)
    return {
        "command": "engram-sync " + " ".join(COMMAND),
        "runs": runs,
        "python_startup_ms": summary(figures["python"], "ms"),
        "cli_import_ms": summary(figures["imports"], "ms"),
        "with_agent_ms": summary(figures["agent"], "ms"),
        "with_agent_cli_ms": summary(figures["agent_cli"], "ms"),
        "without_agent_ms": summary(figures["prompt"], "ms"),
        "cpu_ms": {
            "python_startup": summary(cpu["python"], "ms"),
            "cli_import": summary(cpu["imports"], "ms"),
            "with_agent": summary(cpu["agent"], "ms"),
            "with_agent_cli": summary(cpu["agent_cli"], "ms"),
            "without_agent": summary(cpu["prompt"], "ms"),
            "vault_open": summary(cpu["vault_open"], "ms"),
        },
    }
