"""Paths and helpers shared by the deploy tests."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
#: The test environment's bin dir: engram-relay, python3 and dev tools live here.
BIN = Path(sys.executable).parent

#: Variables that would change which database or keys a child process uses.
_SCRUBBED = ("DATABASE_URL", "SYNC_API_KEYS", "POSTGRES_", "ENGRAM_RELAY_", "RELAY_PUBLISH_")


def load_script(path: Path, name: str) -> ModuleType:
    """A deploy script (not a package module) imported from its file, as `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def find_tool(name: str) -> str | None:
    """`name` in the test environment's bin dir, else on PATH."""
    local = BIN / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process: no inherited relay settings, the venv first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED)}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def free_port() -> int:
    """A free loopback port for a server to bind."""
    return closed_port()
