"""deploy/entrypoint.sh run as is, outside Docker, against the test PostgreSQL."""

from __future__ import annotations

import signal
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from engram_sync.relay.db.migrate import current_revision, head_revision
from tests.conftest import database_url_for
from tests.deploy.support import DEPLOY, child_env, closed_port, free_port

ENTRYPOINT = DEPLOY / "entrypoint.sh"
HEALTHCHECK = DEPLOY / "healthcheck.py"


def run_entrypoint(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(ENTRYPOINT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def healthcheck(port: int) -> int:
    env = child_env(ENGRAM_RELAY_PORT=str(port), ENGRAM_RELAY_HOST="127.0.0.1")
    return subprocess.run(
        ["python3", str(HEALTHCHECK)], env=env, capture_output=True, timeout=30, check=False
    ).returncode


def wait_ready(proc: subprocess.Popen[bytes], url: str, logs: Path) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"entrypoint exited with {proc.returncode}:\n{logs.read_text()}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail(f"relay not ready in time:\n{logs.read_text()}")


def test_entrypoint_migrates_serves_and_stops_on_sigterm(
    empty_database_url: str, tmp_path: Path
) -> None:
    assert current_revision(empty_database_url) is None
    port = free_port()
    data_dir = tmp_path / "data"
    env = child_env(
        DATABASE_URL=empty_database_url,
        ENGRAM_RELAY_HOST="127.0.0.1",
        ENGRAM_RELAY_PORT=str(port),
        ENGRAM_RELAY_DATA_DIR=str(data_dir),
        ENGRAM_RELAY_POOL_SIZE="3",
    )
    out, errs = tmp_path / "stdout.log", tmp_path / "stderr.log"
    url = f"http://127.0.0.1:{port}"
    with out.open("wb") as stdout, errs.open("wb") as stderr:
        proc = subprocess.Popen(["sh", str(ENTRYPOINT)], env=env, stdout=stdout, stderr=stderr)
    try:
        wait_ready(proc, url, errs)
        health = httpx.get(f"{url}/health", timeout=5)
        assert health.status_code == 200
        assert health.json()["status"] == "ok"
        assert current_revision(empty_database_url) == head_revision()
        assert healthcheck(port) == 0

        # The first admin key: printed once on stdout and saved 0600 in the data dir.
        key_file = data_dir / "admin-key"
        key = key_file.read_text().strip()
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        assert key.startswith("en_")
        assert key in out.read_text()
        ok = httpx.get(f"{url}/v1/info", headers={"Authorization": f"Bearer {key}"}, timeout=5)
        assert ok.status_code == 200

        proc.send_signal(signal.SIGTERM)
        # Bounded: a relay that ignores SIGTERM fails here instead of hanging the suite.
        returncode = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # 0 after a graceful shutdown; -SIGTERM if uvicorn's re-raised signal ends the process.
    assert returncode in (0, -signal.SIGTERM), errs.read_text()
    log = errs.read_text()
    for line in ("waiting for the database", "database is up", "applying migrations"):
        assert f"entrypoint: {line}" in log
    assert "Application shutdown complete" in log
    assert healthcheck(port) == 1  # nothing listens any more


def test_entrypoint_without_a_database_url_fails_clearly() -> None:
    result = run_entrypoint(child_env())
    assert result.returncode != 0
    assert "DATABASE_URL is not set" in result.stderr


def test_entrypoint_rejects_a_malformed_wait(empty_database_url: str) -> None:
    env = child_env(DATABASE_URL=empty_database_url, ENGRAM_RELAY_DB_WAIT_SECS="soon")
    result = run_entrypoint(env)
    assert result.returncode != 0
    assert "ENGRAM_RELAY_DB_WAIT_SECS must be a whole number" in result.stderr


def test_entrypoint_gives_up_on_an_unreachable_database_without_leaking_the_password() -> None:
    url = f"postgresql://relay:s3cret-pw@127.0.0.1:{closed_port()}/relay"
    env = child_env(
        DATABASE_URL=url, ENGRAM_RELAY_DB_WAIT_SECS="2", ENGRAM_RELAY_DB_WAIT_INTERVAL="1"
    )
    result = run_entrypoint(env, timeout=60)
    assert result.returncode == 1
    assert "is not reachable after" in result.stderr
    assert "database not reachable yet (attempt 1" in result.stderr
    assert "ENGRAM_RELAY_DB_WAIT_SECS" in result.stderr  # says what to change
    assert "s3cret-pw" not in result.stderr + result.stdout
    assert "relay:***@127.0.0.1" in result.stderr


def test_entrypoint_fails_at_once_for_a_missing_database(postgres_url: str) -> None:
    # A permanent error: no point waiting ENGRAM_RELAY_DB_WAIT_SECS for it.
    env = child_env(
        DATABASE_URL=database_url_for(postgres_url, "no_such_database_here"),
        ENGRAM_RELAY_DB_WAIT_SECS="600",
    )
    result = run_entrypoint(env, timeout=60)
    assert result.returncode == 1
    assert "cannot use the database" in result.stderr
    assert "does not exist" in result.stderr


def test_entrypoint_runs_a_given_command_after_the_wait(empty_database_url: str) -> None:
    env = child_env(DATABASE_URL=empty_database_url)
    result = run_entrypoint(env, "python3", "-c", "print('ran after the wait')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ran after the wait"
    assert "database is up" in result.stderr
    assert current_revision(empty_database_url) is None  # one-off commands do not migrate
