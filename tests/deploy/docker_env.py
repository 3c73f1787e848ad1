"""A private Docker engine for the image tests (tests/deploy/test_image.py).

No image registry is reachable from the CI machine; the Debian mirror and PyPI are. So,
as root, after `../shared/tools/docker/smoke.sh`:

1. Debian's `docker.io` and `debootstrap` (apt-get, when missing);
2. a private `dockerd` with its socket, data and state under the cache dir: no bridge, no
   iptables, so a container has no address of its own and every one of them runs with
   `--network host`, listening on 127.0.0.1 only;
3. `local/debian:bookworm` and `local/debian:trixie` made with debootstrap from the mirror
   apt uses, and on them local stand-ins for `python:3.11-slim-bookworm` (Debian's Python
   3.11 in a venv) and `postgres:17` (Debian trixie's postgresql-17, with the official
   image's interface) under those very names, so deploy/Dockerfile and docker-compose.yml
   are used unmodified (tests/deploy/docker/ holds their Dockerfiles);
4. `engram-relay:local` from deploy/Dockerfile with the classic builder (DOCKER_BUILDKIT=0:
   BuildKit would pull its `# syntax=` frontend from a registry).

The engine's data root lives in ENGRAM_DOCKER_CACHE (default /var/cache/engram-sync-docker,
outside the repository), so the base images are made once and a later run only rebuilds the
relay's image from cached layers. One test session at a time uses it (a lock file); the
dockerd a session started is the one it stops.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.deploy.support import ROOT

CACHE = Path(os.environ.get("ENGRAM_DOCKER_CACHE", "/var/cache/engram-sync-docker"))
#: The stand-in images' build contexts and the compose override (tests/deploy/docker/).
CONTEXTS = Path(__file__).resolve().parent / "docker"
COMPOSE_HOST = CONTEXTS / "compose.host.yml"
RELAY_IMAGE = "engram-relay:local"
PYTHON_IMAGE = "python:3.11-slim-bookworm"
PG_IMAGE = "postgres:17"
PG_SUITE, PG_MAJOR = "trixie", "17"
PACKAGES = ("docker.io", "debootstrap")
#: How long a session waits for another one to finish with the engine.
LOCK_WAIT_S = 40 * 60


class EngineError(RuntimeError):
    """Setting up the engine or an image failed (the message says which step, and why)."""


def debian_mirror() -> str | None:
    """The Debian mirror apt on this machine uses (deb822 sources first, then sources.list)."""
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in sources:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("URIs:") and len(line.split()) > 1:
                return line.split()[1].rstrip("/")
    listing = Path("/etc/apt/sources.list")
    if listing.is_file():
        for line in listing.read_text(encoding="utf-8", errors="replace").splitlines():
            words = line.split()
            if words and words[0] == "deb":
                for word in words[1:]:
                    if word.startswith(("http://", "https://")):
                        return word.rstrip("/")
    return None


def unavailable_reason() -> str | None:
    """Why the engine cannot be set up on this machine, or None when it can."""
    if sys.platform != "linux":
        return "needs Linux (a private dockerd)"
    if os.geteuid() != 0:
        return "needs root (a private dockerd, debootstrap, apt-get)"
    missing = [tool for tool in ("dockerd", "debootstrap") if shutil.which(tool) is None]
    if missing and shutil.which("apt-get") is None:
        return f"{' and '.join(missing)} not installed, and no apt-get to install {PACKAGES}"
    mirror = debian_mirror()
    if mirror is None:
        return "no Debian mirror in apt's sources (debootstrap makes the base images from it)"
    release = f"{mirror}/dists/bookworm/Release"
    try:
        with urllib.request.urlopen(release, timeout=15) as response:
            response.read(1)
    except OSError as exc:
        return f"no network to the Debian mirror ({release}: {exc})"
    return None


@dataclass
class Engine:
    """The private dockerd: a `docker` command line bound to its socket, and step timings."""

    root: Path
    docker: str
    started: subprocess.Popen[bytes] | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """The environment for docker and docker-compose: this engine, the classic builder."""
        env = dict(os.environ)
        env["DOCKER_HOST"] = f"unix://{self.root / 'docker.sock'}"
        env["DOCKER_BUILDKIT"] = "0"
        env.pop("DOCKER_CONTEXT", None)
        return env

    def run(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """`docker ARGS`; with check, a non-zero exit raises EngineError with its output."""
        result = subprocess.run(
            [self.docker, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise EngineError(
                f"docker {' '.join(args[:3])} exited {result.returncode}:\n"
                f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
            )
        return result

    def answers(self) -> bool:
        """True when the engine's socket answers."""
        try:
            return self.run("info", timeout=20, check=False).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def has_image(self, name: str) -> bool:
        return self.run("image", "inspect", name, check=False).returncode == 0

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        yield
        self.timings[name] = round(time.monotonic() - began, 1)

    def remove_all_containers(self) -> None:
        """Every container and unused volume of this private engine (left by a killed run)."""
        ids = self.run("ps", "-aq").stdout.split()
        if ids:
            self.run("rm", "-f", "-v", *ids, timeout=120)
        self.run("volume", "prune", "-f", timeout=120, check=False)


def _checked(command: Sequence[str], what: str, *, timeout: float, log: Path) -> None:
    """Run a setup command with its output in `log`; failing, raise with the log's tail."""
    with log.open("wb") as out:
        result = subprocess.run(
            command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False
        )
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise EngineError(f"{what} exited {result.returncode} (log {log}):\n{tail}")


def install_packages() -> None:
    """docker.io and debootstrap from Debian, when missing."""
    if shutil.which("dockerd") and shutil.which("debootstrap"):
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log = CACHE / "apt.log"
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
    ):
        with log.open("ab") as out:
            result = subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=900, check=False
            )
        if result.returncode != 0:
            raise EngineError(f"{' '.join(command)} exited {result.returncode} (log {log})")


def docker_cli() -> str:
    """The docker command line of the engine's own package (beside dockerd), else PATH's."""
    dockerd = shutil.which("dockerd")
    if dockerd is not None:
        beside = Path(dockerd).with_name("docker")
        if beside.is_file() and os.access(beside, os.X_OK):
            return str(beside)
    found = shutil.which("docker")
    if found is None:
        raise EngineError("no docker command line installed")
    return found


@contextlib.contextmanager
def session_lock() -> Iterator[None]:
    """One test session at a time on the engine (its data root cannot be shared)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "lock").open("w") as lock:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"another session held {CACHE / 'lock'} for {LOCK_WAIT_S}s"
                    ) from None
                time.sleep(2)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def start_dockerd(engine: Engine) -> None:
    """Start the private dockerd unless one already answers on its socket (then reuse it)."""
    if engine.answers():
        return
    root = engine.root
    log = (root / "dockerd.log").open("ab")
    # No bridge and no iptables: containers get no addresses; they use the host network.
    engine.started = subprocess.Popen(
        [
            "dockerd",
            "--host",
            engine.env["DOCKER_HOST"],
            "--data-root",
            str(root / "data"),
            "--exec-root",
            str(root / "exec"),
            "--pidfile",
            str(root / "docker.pid"),
            "--iptables=false",
            "--ip-forward=false",
            "--ip-masq=false",
            "--bridge=none",
            "--storage-driver=overlay2",
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + 60
    while not engine.answers():
        if engine.started.poll() is not None or time.monotonic() > deadline:
            tail = (root / "dockerd.log").read_text(errors="replace")[-3000:]
            raise EngineError(f"dockerd did not come up (exit {engine.started.poll()}):\n{tail}")
        time.sleep(0.5)


def stop_dockerd(engine: Engine) -> None:
    """Stop the dockerd this session started (SIGTERM; it stops its containerd too)."""
    process = engine.started
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)
    # dockerd leaves its host network namespace bind-mounted under the exec root.
    for netns in (engine.root / "exec" / "netns").glob("*"):
        subprocess.run(["umount", str(netns)], capture_output=True, timeout=30, check=False)


def debian_image(engine: Engine, suite: str) -> None:
    """`local/debian:SUITE`: debootstrap minbase from apt's mirror, imported as an image."""
    name = f"local/debian:{suite}"
    if engine.has_image(name):
        return
    mirror = debian_mirror()
    if mirror is None:
        raise EngineError("no Debian mirror in apt's sources")
    rootfs = CACHE / f"rootfs-{suite}"
    shutil.rmtree(rootfs, ignore_errors=True)
    with engine.step(f"debootstrap {suite}"):
        _checked(
            ["debootstrap", "--variant=minbase", suite, str(rootfs), mirror],
            f"debootstrap {suite}",
            timeout=1200,
            log=CACHE / f"debootstrap-{suite}.log",
        )
        for leftover in [
            *rootfs.glob("var/cache/apt/archives/*.deb"),
            *rootfs.glob("var/cache/apt/*.bin"),
        ]:
            leftover.unlink()
        shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
        (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True)
        # The mirror may serve a snapshot whose Release files are past Valid-Until.
        (rootfs / "etc/apt/apt.conf.d/99local").write_text(
            'Acquire::Check-Valid-Until "false";\nAPT::Install-Recommends "false";\n'
        )
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        imported = subprocess.run(
            [engine.docker, "import", "-c", 'CMD ["/bin/bash"]', "-", name],
            stdin=tar.stdout,
            env=engine.env,
            capture_output=True,
            timeout=600,
            check=False,
        )
        tar.stdout.close()
        if tar.wait(timeout=600) != 0 or imported.returncode != 0:
            raise EngineError(f"docker import {name} failed: {imported.stderr.decode()[-2000:]}")
        shutil.rmtree(rootfs, ignore_errors=True)


def build(engine: Engine, tag: str, context: Path, *args: str, what: str) -> None:
    """`docker build --network host` (classic builder) with its log in the cache dir."""
    log = CACHE / f"build-{tag.replace(':', '-').replace('/', '-')}.log"
    command = [engine.docker, "build", "--network", "host", "-t", tag, *args, str(context)]
    with log.open("wb") as out:
        result = subprocess.run(
            command, stdout=out, stderr=subprocess.STDOUT, env=engine.env, timeout=1800
        )
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise EngineError(f"{what}: docker build exited {result.returncode} (log {log}):\n{tail}")


def python_image(engine: Engine) -> None:
    """The stand-in for python:3.11-slim-bookworm, with the host's extra CA certificates."""
    if engine.has_image(PYTHON_IMAGE):
        return
    debian_image(engine, "bookworm")
    context = CACHE / "pybase"
    shutil.rmtree(context, ignore_errors=True)
    shutil.copytree(CONTEXTS / "pybase", context)
    (context / "ca").mkdir()
    for cert in Path("/usr/local/share/ca-certificates").glob("*.crt"):
        shutil.copy(cert, context / "ca")
    with engine.step(f"build {PYTHON_IMAGE}"):
        build(engine, PYTHON_IMAGE, context, what="the python base image")


def postgres_image(engine: Engine) -> None:
    """The stand-in for postgres:17, from Debian trixie's postgresql-17."""
    if engine.has_image(PG_IMAGE):
        return
    debian_image(engine, PG_SUITE)
    with engine.step(f"build {PG_IMAGE}"):
        build(
            engine,
            PG_IMAGE,
            CONTEXTS / "pg",
            "--build-arg",
            f"BASE=local/debian:{PG_SUITE}",
            "--build-arg",
            f"PG_MAJOR={PG_MAJOR}",
            what="the postgres image",
        )


def relay_image(engine: Engine) -> None:
    """engram-relay:local from deploy/Dockerfile as it is (cached layers when unchanged)."""
    with engine.step(f"build {RELAY_IMAGE}"):
        build(
            engine,
            RELAY_IMAGE,
            ROOT,
            "-f",
            str(ROOT / "deploy" / "Dockerfile"),
            what="deploy/Dockerfile",
        )
    # The previous build of the tag, now untagged: dropped, so the cache does not grow.
    engine.run("image", "prune", "-f", timeout=300, check=False)


@contextlib.contextmanager
def docker_engine() -> Iterator[Engine]:
    """The engine with every image built; stops the dockerd it started, on any exit."""
    with session_lock():
        CACHE.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        install_packages()
        engine = Engine(root=CACHE / "engine", docker=docker_cli())
        engine.root.mkdir(parents=True, exist_ok=True)
        try:
            with engine.step("start dockerd"):
                start_dockerd(engine)
            engine.remove_all_containers()
            python_image(engine)
            postgres_image(engine)
            relay_image(engine)
            engine.timings["setup total"] = round(time.monotonic() - began, 1)
            yield engine
        finally:
            with contextlib.suppress(EngineError, subprocess.TimeoutExpired):
                if engine.answers():
                    engine.remove_all_containers()
            stop_dockerd(engine)
