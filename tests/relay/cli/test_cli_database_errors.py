"""Database failures of `engram-relay` commands are one line (issue 14 item 13).

They used to reach the operator as SQLAlchemy/psycopg text over several lines with a
link (or a traceback). Now every command says in one line what is wrong and what to
do, with the password redacted and a non-zero exit; `--debug` adds the driver's error
and the traceback. The real relay CLI in a subprocess, against the test session's
real PostgreSQL (a missing database, an unknown role) and a closed port.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import sqlalchemy.exc

from engram_sync.relay.db.failures import explain
from tests.deploy.support import closed_port
from tests.relay.cli.test_cli import _relay

SECRET = "hunter2-not-for-logs"
COMMANDS = (
    ("stats",),
    ("keys", "list"),
    ("keys", "create", "--vault", "v1"),
    ("migrate",),
    ("gc",),
    ("devices", "list", "--vault", "v1"),
    ("devices", "revoke", "d1", "--vault", "v1"),
    ("pair", "--vault", "v1"),
    ("backup", "--output", "-"),
)


def _with(server_url: str, *, user: str | None = None, database: str | None = None) -> str:
    """The session server's URL for another database (its own credentials), or another
    user (with SECRET as the password: refused whether the server checks passwords or
    not, as the role does not exist)."""
    parts = urlsplit(server_url)
    name = user or parts.username or "postgres"
    password = SECRET if user else parts.password
    netloc = f"{name}:{password}@" if password else f"{name}@"
    netloc += f"{parts.hostname}:{parts.port}"
    path = f"/{database}" if database else parts.path
    return urlunsplit((parts.scheme, netloc, path, parts.query, ""))


def _unreachable() -> str:
    return f"postgresql://engram:{SECRET}@127.0.0.1:{closed_port()}/engram_relay"


def _one_error_line(stderr: str) -> str:
    """The command's stderr is one line, `error: ...`, no traceback, no secret."""
    assert "Traceback" not in stderr
    assert "sqlalche.me" not in stderr
    assert SECRET not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "-".join(c[:2]))
def test_an_unreachable_database_is_one_line_for_every_command(command: tuple[str, ...]) -> None:
    result = _relay(*command, "--database-url", _unreachable())
    assert result.returncode == 1, result.stderr
    line = _one_error_line(result.stderr)
    assert "cannot reach the database at postgresql://engram:***@127.0.0.1:" in line
    assert "connection refused" in line
    assert "is PostgreSQL running" in line
    assert "ENGRAM_RELAY_DATABASE_URL" in line


def test_serve_with_an_unreachable_database_ends_on_one_error_line() -> None:
    """`serve` logs (JSON lines) before it fails; its error is one line among them."""
    result = _relay("serve", "--port", "0", "--database-url", _unreachable())
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "sqlalche.me" not in result.stderr
    assert SECRET not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert "connection refused" in errors[0]
    assert result.stderr.rstrip().endswith("(--debug for details)")


def test_a_missing_database_names_it_and_says_how_to_create_it(postgres_url: str) -> None:
    for command in (("stats",), ("keys", "list"), ("backup", "--output", "-")):
        url = _with(postgres_url, database="no_such_relay_db")
        result = _relay(*command, "--database-url", url)
        assert result.returncode == 1, result.stderr
        line = _one_error_line(result.stderr)
        assert 'the database "no_such_relay_db" does not exist' in line, line
        assert "createdb no_such_relay_db" in line
        password = urlsplit(postgres_url).password
        assert not password or password not in result.stderr


def test_a_refused_login_says_to_check_the_user_and_password(postgres_url: str) -> None:
    url = _with(postgres_url, user="no_such_role")
    for command in (("stats",), ("migrate",), ("backup", "--output", "-")):
        result = _relay(*command, "--database-url", url)
        assert result.returncode == 1, result.stderr
        line = _one_error_line(result.stderr)
        assert "refused the login" in line, line
        assert "no_such_role" in line  # the server's reason: no such role, or the password
        assert "check the user name and password" in line
        assert "no_such_role:***@" in line


def test_the_same_commands_work_on_a_reachable_database(fresh_database_url: str) -> None:
    for command in (("stats",), ("keys", "list"), ("migrate",)):
        result = _relay(*command, "--database-url", fresh_database_url)
        assert result.returncode == 0, result.stderr
        assert "error" not in result.stderr


def test_debug_adds_the_drivers_error_and_the_traceback(postgres_url: str) -> None:
    url = _with(postgres_url, database="no_such_relay_db")
    plain = _relay("stats", "--database-url", url)
    debug = _relay("--debug", "stats", "--database-url", url)
    assert plain.returncode != 0
    assert debug.returncode != 0
    assert "Traceback" in debug.stderr
    assert "OperationalError" in debug.stderr  # psycopg's, under SQLAlchemy (the migrations)
    assert "DatabaseFailureError" in debug.stderr
    assert 'the database "no_such_relay_db" does not exist' in debug.stderr
    assert "Traceback" not in plain.stderr
    assert "--debug" in plain.stderr


# --- the translator on its own, for failures a test server cannot easily produce ---------

URL = f"postgresql://relay:{SECRET}@db.example:6543/relay"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ConnectionRefusedError(111, "Connect call failed"), "connection refused"),
        (socket.gaierror(-2, "Name or service not known"), "unknown host"),
        (TimeoutError(), "timed out"),
        (asyncpg.InvalidPasswordError('password authentication failed for user "relay"'),
         "refused the login"),
        (asyncpg.InvalidCatalogNameError('database "relay" does not exist'),
         'the database "relay" does not exist on db.example:6543'),
        (asyncpg.TooManyConnectionsError("sorry, too many clients already"),
         "no free connection slots"),
        (asyncpg.CannotConnectNowError("the database system is starting up"), "starting up"),
        (asyncpg.InsufficientPrivilegeError("permission denied for table blobs"),
         "lacks a privilege"),
        (asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
         "lost the connection"),
        (sqlalchemy.exc.OperationalError(
            "SELECT 1", {}, Exception('connection failed: connection to server at "10.0.0.5", '
                                      "port 6543 failed: FATAL:  password authentication failed "
                                      'for user "relay"')),
         "refused the login (password authentication failed"),
    ],
)  # fmt: skip
def test_explain_gives_one_line_with_what_to_do(exc: BaseException, expected: str) -> None:
    line = explain(exc, URL)
    assert line is not None
    assert expected in line, line
    assert "\n" not in line
    assert SECRET not in line


def test_explain_leaves_other_errors_alone() -> None:
    assert explain(PermissionError(13, "Permission denied"), URL) is None  # a file, say
    assert explain(ValueError("not a PostgreSQL URL"), URL) is None
    try:
        try:
            raise asyncpg.InvalidCatalogNameError("x")
        except asyncpg.PostgresError:
            raise RuntimeError("a message of its own") from None
    except RuntimeError as wrapped:
        assert explain(wrapped, URL) is None
