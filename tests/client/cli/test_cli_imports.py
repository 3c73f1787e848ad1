"""What a command loads before it runs (issue 17, "a command with the agent running <= 50
ms", docs/agent.md): `list` does not import the relay client (httpx), the pairing and
handoff crypto (spake2), zxcvbn or rich's progress bars; `sync` does. Each command runs as
a real subprocess of the CLI on a real vault, and the modules it had loaded when it exited
are compared by name: no time is measured (the figures are bench/agent.py's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engram_sync.client._accounts import team
from engram_sync.client._cli import teams as cli_teams

PASSPHRASE = "cli imports test: correct horse battery staple"

#: Run the CLI's entry point with argv[2:], then write sorted(sys.modules) to argv[1].
_RUN_AND_DUMP = """
import atexit, json, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["engram-sync", *sys.argv[2:]]
from engram_sync.client._cli.main import main
main()
"""

#: The same through the `engram-sync` entry point (client._cli.fast, the agent's fast path).
_ENTRY_AND_DUMP = _RUN_AND_DUMP.replace(
    "from engram_sync.client._cli.main import main", "from engram_sync.client._cli.fast import main"
)

#: Not for `list` or `search` answered by the key agent (docs/agent.md "Read commands").
NOT_FOR_THE_FAST_PATH = (
    "typer",
    "click",
    "rich",
    "pydantic",
    "httpx",
    "sqlcipher3",
    "msgspec",
    "typing",  # 4-12 ms here; the fast path's modules name it only for mypy
    "engram_sync.client._session",
    "engram_sync.client._cli.main",
)

#: Only for commands that talk to a relay, re-key, pair or show progress bars.
NOT_FOR_LIST = (
    "httpx",
    "spake2",
    "zxcvbn",
    "rich.progress",
    "rich.table",
    "engram_sync.client._sync.engine",
    "engram_sync.client._http.relay_client",
    "engram_sync.client._accounts.account",
    "engram_sync.shared_format.handoff",
    "mcp",  # the mcp extra: `engram-sync mcp` alone (docs/mcp.md)
    "engram_sync.client._mcp.server",
)


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(
        HOME=str(tmp_path / "home"),
        XDG_CONFIG_HOME=str(tmp_path / "home" / "config"),
        XDG_RUNTIME_DIR=str(tmp_path / "run"),  # no key agent listens here
        ENGRAM_VAULT=str(tmp_path / "vault"),
        ENGRAM_PASSPHRASE=PASSPHRASE,
    )
    return env


def _modules_of(tmp_path: Path, *argv: str, runner: str = _RUN_AND_DUMP) -> tuple[int, set[str]]:
    """The exit code of `engram-sync ARGV...` and the modules it had imported at exit."""
    dump = tmp_path / f"modules-{'-'.join(argv)}.json"
    done = subprocess.run(
        [sys.executable, "-c", runner, str(dump), *argv],
        env=_env(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert dump.exists(), done.stderr
    return done.returncode, set(json.loads(dump.read_text()))


@pytest.fixture(scope="module")
def vault_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli-imports")
    (root / "home").mkdir()
    (root / "run").mkdir(mode=0o700)
    code, _ = _modules_of(root, "init", "--force")
    assert code == 0
    code, _ = _modules_of(root, "add", "one memory")
    assert code == 0
    return root


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return [n for n in names if n in modules]


def test_list_loads_no_relay_client_pairing_crypto_or_progress_bar(vault_dir: Path) -> None:
    code, modules = _modules_of(vault_dir, "list")
    assert code == 0
    assert "engram_sync.client._vault.store" in modules  # it did open the vault and list
    assert _loaded(modules, NOT_FOR_LIST) == []


def test_sync_does_load_the_relay_client(vault_dir: Path) -> None:
    # the positive case next to it: the same check sees httpx when a command needs it (an
    # unlinked vault: `sync` fails with the fix, after importing the sync path)
    code, modules = _modules_of(vault_dir, "sync")
    assert code == 1
    assert _loaded(modules, ("httpx", "engram_sync.client._sync.reports", "rich.progress")) == [
        "httpx",
        "engram_sync.client._sync.reports",
        "rich.progress",
    ]


def test_list_and_search_through_the_agent_import_no_cli_and_no_sqlcipher(
    vault_dir: Path,
) -> None:
    code, _ = _modules_of(vault_dir, "unlock")
    assert code == 0
    try:
        for argv in (["list"], ["list", "--json"], ["search", "memory", "--tag", "x"]):
            code, modules = _modules_of(vault_dir, *argv, runner=_ENTRY_AND_DUMP)
            assert code == 0
            assert "engram_sync.client._cli.fast" in modules
            assert _loaded(modules, NOT_FOR_THE_FAST_PATH) == [], argv
    finally:
        code, _ = _modules_of(vault_dir, "lock")
        assert code == 0
    # the positive case: without the agent the same entry point runs the CLI, and the check
    # sees it (ENGRAM_PASSPHRASE opens the vault)
    code, modules = _modules_of(vault_dir, "list", runner=_ENTRY_AND_DUMP)
    assert code == 0
    assert _loaded(modules, ("typer", "rich", "sqlcipher3")) == ["typer", "rich", "sqlcipher3"]


def test_the_package_imports_its_public_names_on_first_use() -> None:
    probe = (
        "import sys, engram_sync.client as c; before = 'httpx' in sys.modules; "
        "c.SyncReport; print(before, 'httpx' in sys.modules, c.SyncReport.__module__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split() == ["False", "True", "engram_sync.client._sync.reports"]


def test_team_request_default_wait_is_the_handoffs() -> None:
    # the CLI keeps a copy so that its --help needs no import of the handoff
    assert cli_teams.DEFAULT_WAIT_SECS == team.DEFAULT_WAIT_SECS
