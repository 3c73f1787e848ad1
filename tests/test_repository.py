"""Repository-level checks: the README's test command is CI's, and the code is lint/type clean."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```sh\n(python3 -m venv .*?)\n```", text)


#: What `.ci/run` runs after the README's command: the tiers left out for their
#: infrastructure, their tests alone (tests/tiers.py); the README lists it too.
TIER_RUN = '.venv/bin/python -m pytest --citus --docker --wheel -m "citus or docker or wheel"'


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """`.ci/run` runs the README's test command, then the tier run the README also lists."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    test_commands = [c for c in _readme_commands() if "pytest" in c]
    assert len(test_commands) == 1, test_commands
    assert ci[-2] == test_commands[0]
    assert ci[-1] == TIER_RUN
    assert f"```sh\n{TIER_RUN}\n```" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "set -euo pipefail" in ci


def test_readme_has_the_relay_command() -> None:
    assert any("engram-relay serve" in c for c in _readme_commands())


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = BIN / tool
    if not exe.exists():
        pytest.fail(f"{tool} is not installed in the test environment ({exe})")
    return subprocess.run(
        [str(exe), *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=600
    )


def test_ruff_clean() -> None:
    result = _run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_clean() -> None:
    result = _run("ruff", "format", "--check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_clean() -> None:
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


_OLD_TOP_LEVEL = re.compile(r"^\s*(?:from|import) (?:relay|client|shared_format|cli_kit)\b", re.M)
_NAMESPACED = re.compile(
    r"^\s*(?:from|import) engram_sync\.(?:relay|client|shared_format|cli_kit)\b", re.M
)


def test_code_imports_the_packages_by_their_installed_names() -> None:
    """The checkout's root is on sys.path under pytest, so `import relay` would work here and
    load a second copy of the relay; installed, only `engram_sync.relay` exists (issue 19)."""
    tracked = subprocess.run(
        ["git", "ls-files", "*.py", "*.sh"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    sources = {path: (ROOT / path).read_text(encoding="utf-8") for path in tracked}
    old = [path for path, text in sources.items() if _OLD_TOP_LEVEL.search(text)]
    assert old == [], old
    # the positive case next to it: the scan does see the imports, in their installed form
    assert len([path for path, text in sources.items() if _NAMESPACED.search(text)]) > 100


def test_the_migrations_sit_at_the_top_level_and_ship_inside_the_relay() -> None:
    """The design card's layout (issue 32): `alembic/` at the top level holds the migration
    environment and versions; `relay/migrations` is a relative link to it, so the package
    data of `engram_sync.relay` still carries them (docs/packaging.md)."""
    top = ROOT / "alembic"
    assert (top / "env.py").is_file()
    assert sorted((top / "versions").glob("0001_*.py"))
    link = ROOT / "relay" / "migrations"
    assert link.is_symlink()
    assert os.readlink(link) == "../alembic"
    assert "script_location = %(here)s/alembic" in (ROOT / "alembic.ini").read_text()


#: The product's code (not its tests, benchmarks or migration scripts).
PRODUCT = ("client", "relay", "shared_format", "cli_kit")
LONG = 60


def _product_functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, list[str]]]:
    found = []
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_symlink() or "migrations" in path.relative_to(ROOT).parts:
                continue
            text = path.read_text(encoding="utf-8")
            lines = text.splitlines()
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    found.append((str(path.relative_to(ROOT)), node, lines))
    return found


def test_no_product_function_is_complex_or_long_without_saying_why() -> None:
    """Issue 32: radon rates no product function D or worse, and a function over 60 lines
    (its `def` to its last line) says why in a `# long:` comment just above its `def`."""
    from radon.complexity import cc_rank, cc_visit

    complex_ = [
        f"{path}:{block.lineno} {block.name} {cc_rank(block.complexity)} ({block.complexity})"
        for path in sorted({p for p, _, _ in _product_functions()})
        for block in cc_visit((ROOT / path).read_text(encoding="utf-8"))
        if cc_rank(block.complexity) in "DEF"
    ]
    assert complex_ == []
    unexplained = []
    for path, node, lines in _product_functions():
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        above = [line.strip() for line in lines[max(0, node.lineno - 4) : node.lineno - 1]]
        if length > LONG and not any(line.startswith("# long:") for line in above):
            unexplained.append(f"{path}:{node.lineno} {node.name} ({length} lines)")
    assert unexplained == []
