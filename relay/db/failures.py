"""Database failures of the `engram-relay` commands, explained in one line.

asyncpg, psycopg (under SQLAlchemy, for the migrations) and the socket layer each word
the same few problems differently, psycopg over several lines with a link. `explain`
turns any of them into one line saying what is wrong and what to do, naming the
database by its URL with the password redacted; `relay.db.runtime.database` raises it as
a `DatabaseFailureError` (chained to the original, which `--debug` shows), so every command
gets it without a try/except of its own.
"""

from __future__ import annotations

import errno
import re
import socket
from collections.abc import Iterator
from typing import Final
from urllib.parse import urlsplit

import asyncpg
import sqlalchemy.exc

from engram_sync.relay.db.url import redact_url

try:  # psycopg is what the migrations connect with (alembic + SQLAlchemy)
    import psycopg
except ImportError:  # pragma: no cover - a declared dependency
    psycopg = None  # type: ignore[assignment]

WHERE: Final = "--database-url, ENGRAM_RELAY_DATABASE_URL or DATABASE_URL"

# psycopg's connection errors carry no SQLSTATE: the server's words, after "FATAL:".
_FATAL: Final = re.compile(r"FATAL:\s+(.*)")
_AUTH: Final = re.compile(
    r"password authentication failed|role \S+ does not exist|no pg_hba\.conf entry"
    r"|authentication failed|no password supplied|password is required",
    re.IGNORECASE,
)
_NO_DATABASE: Final = re.compile(r'database "([^"]*)" does not exist', re.IGNORECASE)
_REFUSED: Final = re.compile(r"connection refused", re.IGNORECASE)
_NO_HOST: Final = re.compile(
    r"failed to resolve host|could not translate host name|name or service not known"
    r"|nodename nor servname",
    re.IGNORECASE,
)
_TIMEOUT: Final = re.compile(r"timeout expired|timed out", re.IGNORECASE)
_STARTING: Final = re.compile(r"the database system is (starting up|shutting down)", re.I)
_TOO_MANY: Final = re.compile(r"too many clients|remaining connection slots", re.I)
_LOST: Final = re.compile(
    r"server closed the connection unexpectedly|connection was closed|terminating connection",
    re.IGNORECASE,
)


class DatabaseFailureError(Exception):
    """A database problem of a command, as one line: what is wrong and what to do."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, what SQLAlchemy wraps (`orig`) and its causes, each once."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        orig = getattr(current, "orig", None)
        pending += [orig if isinstance(orig, BaseException) else None]
        pending.append(current.__cause__)
        if not current.__suppress_context__:
            pending.append(current.__context__)


_NETWORK_ERRNOS: Final = frozenset(
    {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.ENETDOWN, errno.EADDRNOTAVAIL}
)


def _is_network_error(exc: BaseException) -> bool:
    """A socket failure on the way to the server (not, say, a file the command writes)."""
    if isinstance(exc, ConnectionError | socket.gaierror | socket.herror | TimeoutError):
        return True
    return isinstance(exc, OSError) and exc.errno in _NETWORK_ERRNOS


def _is_database_error(exc: BaseException) -> bool:
    kinds: list[type[BaseException]] = [
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        sqlalchemy.exc.DBAPIError,
        sqlalchemy.exc.OperationalError,
    ]
    if psycopg is not None:
        kinds.append(psycopg.Error)
    return isinstance(exc, tuple(kinds))


def _server_words(exc: BaseException) -> str:
    """The server's or driver's message on one line, without psycopg's prefixes."""
    text = str(exc).strip()
    fatal = _FATAL.search(text)
    if fatal:
        text = fatal.group(1)
    text = text.splitlines()[0] if text else type(exc).__name__
    text = re.sub(r"^\(\S+\)\s*", "", text)  # SQLAlchemy's "(psycopg.OperationalError) "
    return text.removeprefix("connection failed: ").strip()


def _target(url: str) -> tuple[str, str, str]:
    """(redacted URL, host:port, database name) for the messages."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "localhost"
        where = f"[{host}]" if ":" in host else host  # an IPv6 address
        where += f":{parts.port or 5432}"
        name = parts.path.lstrip("/") or (parts.username or "")
    except ValueError:
        where, name = "the database server", ""
    return redact_url(url), where, name


_Kinds = tuple[type[BaseException], ...]
# What `explain` says, first match wins: the exceptions that mean it, or (psycopg, the
# socket layer) the words that do; str.format fields: shown (the redacted URL), where
# (host:port), db (the database name), words (the server's), WHERE (where the URL is set).
_EXPLANATIONS: Final[tuple[tuple[_Kinds, re.Pattern[str] | None, str], ...]] = (
    (
        (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError),
        _AUTH,
        "the database at {shown} refused the login ({words}): check the user name and "
        "password in {WHERE}",
    ),
    (
        (asyncpg.InvalidCatalogNameError,),
        _NO_DATABASE,
        'the database "{db}" does not exist on {where}: create it (createdb {db}, or '
        "CREATE DATABASE as a superuser) or fix the database name in {WHERE}",
    ),
    (
        (ConnectionRefusedError,),
        _REFUSED,
        "cannot reach the database at {shown} (connection refused): is PostgreSQL "
        "running and listening on {where}? check {WHERE}",
    ),
    (
        (socket.gaierror,),
        _NO_HOST,
        "cannot reach the database at {shown} (unknown host): check the host name in {WHERE}",
    ),
    (
        (TimeoutError,),
        _TIMEOUT,
        "cannot reach the database at {shown} (timed out): check that {where} is "
        "reachable from here (network, firewall) and {WHERE}",
    ),
    (
        (asyncpg.CannotConnectNowError,),
        _STARTING,
        "the database at {shown} is starting up or shutting down ({words}): retry shortly",
    ),
    (
        (asyncpg.TooManyConnectionsError,),
        _TOO_MANY,
        "the database at {shown} has no free connection slots ({words}): stop idle "
        "clients, lower ENGRAM_RELAY_POOL_SIZE or raise PostgreSQL's max_connections",
    ),
    (
        (asyncpg.InsufficientPrivilegeError,),
        None,
        "the database user lacks a privilege at {shown} ({words}): grant it, or use "
        "the user that owns the relay's database",
    ),
    (
        (asyncpg.ConnectionDoesNotExistError, ConnectionResetError),
        _LOST,
        "lost the connection to the database at {shown} ({words}): check that "
        "PostgreSQL is still running (its log says why it closed), then retry",
    ),
)


def explain(exc: BaseException, url: str) -> str | None:
    """One line for a database failure of a command using `url`, or None when `exc` is
    not a database failure (a bug, a usage error: those keep their own handling)."""
    if not (_is_database_error(exc) or _is_network_error(exc)):
        return None  # e.g. a CliError raised while handling one: it says what it means
    chain = list(_chain(exc))
    shown, where, name = _target(url)
    words = _server_words(next((e for e in chain if _is_database_error(e)), chain[-1]))
    text = " ".join(str(e) for e in chain)
    missing = _NO_DATABASE.search(text)
    db = missing.group(1) if missing else name
    for kinds, said, line in _EXPLANATIONS:
        if any(isinstance(e, kinds) for e in chain) or (said is not None and said.search(text)):
            return line.format(shown=shown, where=where, db=db, words=words, WHERE=WHERE)
    if not any(_is_database_error(e) for e in chain):  # another network failure
        return f"cannot reach the database at {shown} ({words}): check {WHERE}"
    return f"the database at {shown} failed: {words}"
