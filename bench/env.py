"""The environment of a run, for the report's first table."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
_PACKAGES: Final = ("litestar", "uvicorn", "asyncpg", "httpx", "msgspec", "sqlcipher3")


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(  # noqa: S603 - fixed git command
            ["git", *args],  # noqa: S607 - git from PATH
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def git_state() -> tuple[str, bool | None]:
    """(short sha or "unknown", dirty flag or None when unknown)."""
    sha = _git("rev-parse", "--short", "HEAD") or "unknown"
    status = _git("status", "--porcelain", "--untracked-files=no")
    return sha, None if status is None else bool(status)


def cpu_model() -> str:
    """The CPU model name (Linux), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment(*, postgres_version: str, postgres_where: str, durability: str) -> dict[str, Any]:
    """Everything the report's environment table shows."""
    sha, dirty = git_state()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    return {
        "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count() or 0,
        "usable_cores": usable,
        "load_average_1m_at_start": os.getloadavg()[0],
        "os": platform.platform(),
        "python": platform.python_version(),
        "postgresql": postgres_version,
        "postgresql_where": postgres_where,
        "postgresql_durability": durability,
        "git_sha": sha,
        "git_dirty": dirty,
        "packages": {name: _version(name) for name in _PACKAGES},
    }
