"""The embedded PostgreSQL server: lifecycle, persistence, ports, errors, root handling."""

from __future__ import annotations

import asyncio
import os
import re
import socket
from pathlib import Path

import asyncpg
import pytest

from engram_sync.relay.db.embedded import (
    EmbeddedPostgres,
    EmbeddedPostgresError,
    default_data_dir,
)
from engram_sync.relay.db.embedded_install import SYSTEM_USER

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
# The password is generated (secrets.token_urlsafe): see test_db_embedded_auth.py.
URL_RE = re.compile(r"^postgresql://postgres:[A-Za-z0-9_-]{40,}@127\.0\.0\.1:(\d+)/engram_relay$")


async def _query(url: str, sql: str) -> object:
    conn = await asyncpg.connect(url)
    try:
        if ";" in sql:
            await conn.execute(sql)  # several statements, no result
            return None
        return await conn.fetchval(sql)
    finally:
        await conn.close()


def query(url: str, sql: str) -> object:
    return asyncio.run(_query(url, sql))


def test_start_query_stop_start_keeps_data(server: EmbeddedPostgres) -> None:
    url = server.start()
    assert URL_RE.match(url), url
    assert server.is_running()
    assert query(url, "SELECT current_database()") == "engram_relay"
    query(url, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('still here')")

    server.stop()
    assert not server.is_running()
    with pytest.raises(EmbeddedPostgresError, match="not been started"):
        _ = server.url

    url2 = server.start()
    assert URL_RE.match(url2)
    assert query(url2, "SELECT v FROM kept") == "still here"


def test_extra_settings_apply(scratch_dir: Path) -> None:
    with EmbeddedPostgres(scratch_dir / "pgdata", settings={"fsync": "off"}) as pg:
        assert query(pg.url, "SHOW fsync") == "off"
    with pytest.raises(ValueError, match="unsupported server setting"):
        EmbeddedPostgres(scratch_dir, settings={"fsync": "off; rm -rf /"})


def test_given_port_and_reuse_of_a_running_server(server: EmbeddedPostgres) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pinned = EmbeddedPostgres(server.data_dir, port=port)
    url = pinned.start()
    assert URL_RE.match(url)
    assert url.endswith(f"@127.0.0.1:{port}/engram_relay")
    # A second handle on the same data dir adopts the running server.
    assert server.start() == url
    assert server.port == port


def test_port_in_use_is_a_clear_error(server: EmbeddedPostgres) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        busy = EmbeddedPostgres(server.data_dir, port=port)
        with pytest.raises(EmbeddedPostgresError, match=f"port {port} .* already in use"):
            busy.start()
    assert not server.is_running()


def test_stop_when_not_running_is_a_noop(scratch_dir: Path) -> None:
    pg = EmbeddedPostgres(scratch_dir / "never-started")
    pg.stop()
    assert not pg.is_running()


def test_refuses_a_non_empty_foreign_dir(scratch_dir: Path) -> None:
    (scratch_dir / "junk.txt").write_text("not postgres")
    with pytest.raises(EmbeddedPostgresError, match="not empty and is not a PostgreSQL data dir"):
        EmbeddedPostgres(scratch_dir).start()


def test_rejects_bad_database_names_and_ports(scratch_dir: Path) -> None:
    with pytest.raises(ValueError, match="invalid database name"):
        EmbeddedPostgres(scratch_dir, database='x"; DROP')
    with pytest.raises(ValueError, match="invalid port"):
        EmbeddedPostgres(scratch_dir, port=70000)


@pytest.mark.skipif(not IS_ROOT, reason="root-only behaviour")
def test_root_default_data_dir_is_outside_root_home() -> None:
    assert default_data_dir() == Path("/var/lib/engram-relay/postgres")


@pytest.mark.skipif(not IS_ROOT, reason="root-only behaviour")
def test_root_refuses_a_data_dir_in_root_home() -> None:
    target = Path("/root/engram-relay-should-not-exist/pgdata")
    with pytest.raises(EmbeddedPostgresError, match="root's home"):
        EmbeddedPostgres(target).start()
    assert not target.parent.exists()


@pytest.mark.skipif(not IS_ROOT, reason="root-only behaviour")
def test_root_runs_the_server_as_the_system_user(server: EmbeddedPostgres) -> None:
    import pwd

    server.start()
    pid = int((server.data_dir / "postmaster.pid").read_text().splitlines()[0])
    status = Path(f"/proc/{pid}/status").read_text()
    uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
    groups_line = next(line for line in status.splitlines() if line.startswith("Groups:"))
    expected = pwd.getpwnam(SYSTEM_USER).pw_uid
    assert set(uid_line.split()[1:]) == {str(expected)}
    assert groups_line.split()[1:] == []  # no supplementary groups (in particular not root)
    assert server.data_dir.stat().st_uid == expected


def test_the_last_attached_user_stops_the_server_and_a_dead_one_does_not_count(
    server: EmbeddedPostgres,
) -> None:
    """attach/detach (what `engram-relay` commands use): the server runs while any live
    process is attached, whichever attached first; a dead user's entry is ignored."""
    first = EmbeddedPostgres(server.data_dir)
    second = EmbeddedPostgres(server.data_dir)
    url = first.attach()
    assert second.attach() == url
    first.detach()  # the one that started it leaves first
    assert server.is_running()
    assert query(url, "SELECT 1") == 1
    # a process that attached and died (SIGKILL): its entry names a pid that is gone
    users = server.data_dir / "engram-relay.users"
    (users / "999999999.1").write_text("1")
    second.detach()
    assert not server.is_running()
    assert list(users.iterdir()) == []  # the dead entry is gone too


def test_attach_leaves_a_server_it_did_not_start_running(server: EmbeddedPostgres) -> None:
    url = server.start()  # started outside the registry (like the test session's server)
    guest = EmbeddedPostgres(server.data_dir)
    assert guest.attach() == url
    guest.detach()
    assert server.is_running()
