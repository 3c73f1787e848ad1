"""Import rules: relay -> shared_format <- client, checked by import-linter.

The contracts live in pyproject.toml `[tool.importlinter]`. `lint-imports` puts its working
directory first on sys.path, so running it from a directory analyses that directory's packages,
however (or whether) the project is installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("shared_format", "relay", "client", "cli_kit")
INDEPENDENT = "relay and client never import each other"
PURE = "shared_format imports no relay, client, HTTP or database code"
HTTP_FREE = "relay store and rules layers import no HTTP code"
LAYERS = "the relay's layers: cli > serving > http > services > store > domain | db"
CLIENT_LAYERS = "the client's layers, top to bottom"
CLI_KIT = "cli_kit imports no relay, client or shared_format code"
WEB_VERIFY = "web verify imports no web server (Starlette, uvicorn)"


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    script = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"
    return subprocess.run(
        [sys.executable, "-c", script, "--no-cache", "--no-logo", str(cwd / "pyproject.toml")],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_the_repository_keeps_every_import_contract() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{INDEPENDENT} KEPT" in result.stdout
    assert f"{PURE} KEPT" in result.stdout
    assert f"{HTTP_FREE} KEPT" in result.stdout
    assert f"{LAYERS} KEPT" in result.stdout
    assert f"{CLIENT_LAYERS} KEPT" in result.stdout
    assert f"{WEB_VERIFY} KEPT" in result.stdout
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["importlinter"]
    assert f"{len(contracts['contracts'])} kept, 0 broken" in result.stdout


def test_the_shared_vault_format_may_use_sqlcipher() -> None:
    # The positive case next to the forbidden list: the repository run above passes *with*
    # shared_format importing sqlcipher3 (the vault file format is shared, not a server detail).
    source = (ROOT / "shared_format" / "vault" / "sqlcipher.py").read_text(encoding="utf-8")
    assert "import sqlcipher3" in source or "from sqlcipher3" in source


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the four packages, engram_sync/ and pyproject.toml, to break one import at a
    time (engram_sync/'s links to the packages are relative, so they point into the copy)."""
    base = tmp_path_factory.mktemp("import_rules")
    for package in (*PACKAGES, "engram_sync"):
        shutil.copytree(
            ROOT / package,
            base / package,
            symlinks=True,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    shutil.copy2(ROOT / "pyproject.toml", base / "pyproject.toml")
    return base


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("shared_format/b64.py", "import engram_sync.relay.domain.instants", PURE),
        ("shared_format/b64.py", "from engram_sync.client._sync import config", PURE),
        ("shared_format/wire.py", "import httpx", PURE),
        ("shared_format/vault/schema.py", "import asyncpg", PURE),
        ("shared_format/sync_keys.py", "from litestar import Litestar", PURE),
        ("shared_format/kdf.py", "import sqlalchemy", PURE),
        ("shared_format/kdf.py", "import psycopg", PURE),
        ("shared_format/kdf.py", "import uvicorn", PURE),
        ("shared_format/kdf.py", "import alembic", PURE),
        ("relay/domain/instants.py", "import engram_sync.client._sync.config", INDEPENDENT),
        ("client/_sync/config.py", "from engram_sync.relay.domain import instants", INDEPENDENT),
        ("relay/store/sync.py", "import litestar", HTTP_FREE),
        (
            "relay/services/push_groups.py",
            "from engram_sync.relay.http.routes import ids",
            HTTP_FREE,
        ),
        # indirect: relay.store.push -> relay.domain.push_rules -> relay.domain.instants
        # -> relay.http.errors
        (
            "relay/domain/instants.py",
            "from engram_sync.relay.http.errors import bad_request",
            HTTP_FREE,
        ),
        # the relay's layers: a lower folder importing a higher one
        ("relay/store/sync.py", "from engram_sync.relay.services import state", LAYERS),
        ("relay/domain/labels.py", "import engram_sync.relay.store.push", LAYERS),
        ("relay/services/maintenance.py", "from engram_sync.relay.cli import main", LAYERS),
        ("relay/db/url.py", "from engram_sync.relay.domain import instants", LAYERS),
        # the client's layers: the climbs and the circle issue 32 counted, and the HTTP bottom
        ("client/_vault/store.py", "from engram_sync.client._sync import engine", CLIENT_LAYERS),
        ("client/_sync/engine.py", "import engram_sync.client._session", CLIENT_LAYERS),
        ("client/_sync/engine.py", "from engram_sync.client._accounts import team", CLIENT_LAYERS),
        ("client/_agent/reads.py", "from engram_sync.client._cli import main", CLIENT_LAYERS),
        ("client/_http/relay_client.py", "import engram_sync.client._vault.store", CLIENT_LAYERS),
        ("client/_render.py", "from engram_sync.client._api import Vault", CLIENT_LAYERS),
        # the kit both CLIs share holds nothing of either
        ("cli_kit/usage.py", "import engram_sync.relay.cli.main", CLI_KIT),
        ("cli_kit/usage.py", "from engram_sync.client import _errors", CLI_KIT),
        # web verify runs without the web extra
        ("client/_web/verify_fetch.py", "import starlette", WEB_VERIFY),
        ("client/_web/verify.py", "from engram_sync.client._web import app", WEB_VERIFY),
    ],
)
def test_a_forbidden_import_breaks_a_contract(
    pristine: Path, tmp_path: Path, module: str, line: str, contract: str
) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(pristine, tree, symlinks=True)
    target = tree / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{line}  # noqa\n", "utf-8")
    result = _lint_imports(tree)
    assert result.returncode != 0, result.stdout
    assert f"{contract} BROKEN" in result.stdout
    imported = line.split()[1]  # the module named on the line ends the chain reported
    assert f"-> {imported}" in result.stdout, result.stdout
