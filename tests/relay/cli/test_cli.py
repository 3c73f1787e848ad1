"""`engram-relay` as a person runs it: serve on the embedded PostgreSQL, admin commands."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from bench.relay_process import listening_workers
from engram_sync.relay.db.embedded import EmbeddedPostgres
from tests.relay.conftest import free_port
from tests.relay.support import Sealer, pull_ok, push

BIN = Path(sys.executable).parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "DATABASE_URL" not in k}
    env.pop("SYNC_API_KEYS", None)
    env.update(extra)
    return env


def _relay(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "engram-relay"), *args],
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Not pytest's tmp_path: as root the embedded server runs as another user, which
    # must traverse the parents of its data dir (tmp_path's parents are private).
    path = Path(tempfile.mkdtemp(prefix="engram-relay-cli-"))
    try:
        yield path
    finally:
        EmbeddedPostgres(path / "postgres").stop()
        shutil.rmtree(path, ignore_errors=True)


def _wait_ready(url: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"relay exited early: {proc.communicate()}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("relay did not become ready")


def test_serve_on_embedded_postgres_mints_one_admin_key_and_stops_cleanly(
    data_dir: Path,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(BIN / "engram-relay"), "serve", "--port", str(port), "--data-dir", str(data_dir)]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        _wait_ready(url, proc)
        key_file = data_dir / "admin-key"
        assert key_file.stat().st_mode & 0o777 == 0o600
        key = key_file.read_text().strip()
        assert key.startswith("en_")
        authed = httpx.get(f"{url}/v1/vaults/v/stats", headers={"Authorization": f"Bearer {key}"})
        assert authed.status_code == 200
        assert httpx.get(f"{url}/v1/vaults/v/stats").status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert url in out
    assert key in out  # printed once, with the URL
    assert not EmbeddedPostgres(data_dir / "postgres").is_running()  # database stopped too
    assert key not in err  # never logged

    # a second start finds keys and mints none
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        _wait_ready(url, proc)
    finally:
        proc.send_signal(signal.SIGINT)
        out2, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert "admin key" not in out2
    assert (data_dir / "admin-key").read_text().strip() == key


def test_a_relay_adopts_the_embedded_server_a_killed_relay_left_and_stops_it(
    data_dir: Path,
) -> None:
    """Issue 14 (15): a relay killed with SIGKILL leaves its embedded PostgreSQL running;
    the next relay reused it but never stopped it. It adopts it now and stops it on
    SIGTERM, while an admin command run meanwhile leaves it to the relay."""
    embedded = EmbeddedPostgres(data_dir / "postgres")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(BIN / "engram-relay"), "serve", "--port", str(port), "--data-dir", str(data_dir)]
    first = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        _wait_ready(url, first)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    assert embedded.is_running()  # orphaned

    second = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        _wait_ready(url, second)
        stats = _relay("stats", "--data-dir", str(data_dir))
        assert stats.returncode == 0, stats.stderr
        assert embedded.is_running()  # the admin command leaves it to the relay
        assert httpx.get(f"{url}/ready", timeout=5).status_code == 200
    finally:
        second.send_signal(signal.SIGTERM)
        _, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert not embedded.is_running()


def test_admin_commands(fresh_database_url: str) -> None:
    env = _env(DATABASE_URL=fresh_database_url)
    created = _relay("keys", "create", "--vault", "team", "--admin", "--label", "ops", env=env)
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("en_")
    listing = _relay("keys", "list", env=env)
    assert listing.returncode == 0
    assert key[:8] in listing.stdout
    assert key not in listing.stdout  # only the prefix is ever shown again
    key_id = created.stderr.split()[1]
    assert key_id.startswith("k_")

    revoked = _relay("keys", "revoke", key_id, env=env)
    assert revoked.returncode == 0, revoked.stderr
    unknown = _relay("keys", "revoke", "k_nope", env=env)
    assert unknown.returncode != 0
    assert "no key with id" in unknown.stderr
    assert "Traceback" not in unknown.stderr

    dev = _relay("devices", "revoke", "--vault", "team", "laptop-1", "--force", env=env)
    assert dev.returncode == 0, dev.stderr
    roster = _relay("devices", "list", "--vault", "team", env=env)
    assert "laptop-1" in roster.stdout
    assert "yes" in roster.stdout

    stats = _relay("stats", env=env)
    assert "revoked_devices: 1" in stats.stdout
    gc = _relay("gc", env=env)
    assert gc.returncode == 0
    assert "removed 0 tombstone(s)" in gc.stdout
    migrated = _relay("migrate", env=env)
    assert migrated.returncode == 0


def _count(database_url: str, query: str) -> int:
    import asyncio

    import asyncpg

    from engram_sync.relay.db.url import to_libpq_url

    async def go() -> int:
        conn = await asyncpg.connect(to_libpq_url(database_url))
        try:
            return int(await conn.fetchval(query))
        finally:
            await conn.close()

    return asyncio.run(go())


def test_devices_revoke_refuses_a_device_the_vault_never_saw(fresh_database_url: str) -> None:
    """Issue 14: a mistyped id exited 0 and put a phantom revoked device on the roster."""
    env = _env(DATABASE_URL=fresh_database_url)
    typo = _relay("devices", "revoke", "--vault", "team", "laptpo-1", env=env)
    assert typo.returncode != 0
    assert "vault team has no device 'laptpo-1'" in typo.stderr
    assert "--force" in typo.stderr
    assert len(typo.stderr.strip().splitlines()) == 1
    assert "Traceback" not in typo.stderr
    assert _count(fresh_database_url, "SELECT count(*) FROM devices") == 0  # no phantom

    # a device with a key bound to it is known (it may not have pushed yet)
    bound = _relay("keys", "create", "--vault", "team", "--device", "phone", env=env)
    assert bound.returncode == 0, bound.stderr
    ok = _relay("devices", "revoke", "--vault", "team", "phone", env=env)
    assert ok.returncode == 0, ok.stderr
    assert "1 bound key(s) revoked" in ok.stdout
    again = _relay("devices", "revoke", "--vault", "team", "phone", env=env)  # idempotent
    assert again.returncode == 0, again.stderr
    other_vault = _relay("devices", "revoke", "--vault", "home", "phone", env=env)
    assert other_vault.returncode != 0  # known in team, not in home

    forced = _relay("devices", "revoke", "--vault", "team", "stolen-1", "--force", env=env)
    assert forced.returncode == 0, forced.stderr
    revoked = "SELECT count(*) FROM devices WHERE revoked_at IS NOT NULL"
    assert _count(fresh_database_url, revoked) == 2  # phone and the pre-revoked stolen-1


@pytest.mark.parametrize(("workers", "holder_reuses_port"), [(1, False), (2, False), (2, True)])
def test_serve_on_a_taken_port_fails_before_it_mints_a_key(
    fresh_database_url: str, data_dir: Path, workers: int, holder_reuses_port: bool
) -> None:
    """Issue 14 (12): serve printed "listening" and minted the first admin key, then
    failed to bind. It binds first now: one line naming the port, no key. A port held
    with SO_REUSEPORT (another relay's workers) is taken too, not shared."""
    with socket.socket() as taken:
        if holder_reuses_port:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _relay("serve", "--port", str(port), "--data-dir", str(data_dir),
                        "--workers", str(workers),
                        env=_env(DATABASE_URL=fresh_database_url))  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in result.stderr
    assert "--port" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "listening" not in result.stdout
    assert "admin key" not in result.stdout
    assert not (data_dir / "admin-key").exists()
    assert _count(fresh_database_url, "SELECT count(*) FROM api_keys") == 0


def test_bad_input_is_one_clear_line(fresh_database_url: str) -> None:
    env = _env(DATABASE_URL=fresh_database_url)
    bad_vault = _relay("keys", "create", "--vault", "", env=env)
    assert bad_vault.returncode != 0
    assert "vault id is empty" in bad_vault.stderr
    bad_url = _relay("stats", env=_env(DATABASE_URL="mysql://nope"))
    assert bad_url.returncode != 0
    assert "not a PostgreSQL URL" in bad_url.stderr
    assert "Traceback" not in bad_url.stderr + bad_vault.stderr
    assert _relay("--help").returncode == 0


def test_gc_erases_expired_handoffs_codes_and_sessions(fresh_database_url: str) -> None:
    import asyncio

    import asyncpg

    async def seed() -> None:
        conn = await asyncpg.connect(fresh_database_url)
        try:
            await conn.execute(
                "INSERT INTO handoff_requests (vault_id, request_id, public_key, label,"
                " requester_key_id, created_at, expires_at, admin_public_key, sealed, sealed_at)"
                " VALUES ('v', 'r1', 'pk', 'l', 'k', now() - interval '2 days',"
                " now() - interval '1 hour', 'apk', 'sealed-bytes', now() - interval '2 hours')"
            )
        finally:
            await conn.close()

    async def sealed() -> object:
        conn = await asyncpg.connect(fresh_database_url)
        try:
            return await conn.fetchval("SELECT sealed FROM handoff_requests WHERE request_id='r1'")
        finally:
            await conn.close()

    asyncio.run(seed())
    assert asyncio.run(sealed()) == "sealed-bytes"
    result = _relay("gc", env=_env(DATABASE_URL=fresh_database_url))
    assert result.returncode == 0, result.stderr
    assert "expired and erased: 1 handoff_requests" in result.stdout
    assert asyncio.run(sealed()) is None


def _listening_workers(pid: int, port: int, *, want: int) -> list[psutil.Process]:
    """The processes under `pid` listening on `port`, once `want` do (or after 30 s): /ready
    answers as soon as the first worker serves, and each worker opens its own socket."""
    deadline = time.monotonic() + 30
    while True:
        listening = listening_workers(pid, port)
        if len(listening) >= want or time.monotonic() > deadline:
            return listening
        time.sleep(0.05)


def _connections_per_worker(
    port: int, workers: list[psutil.Process], *, connections: int
) -> list[int]:
    """Open `connections` at once (as devices reconnecting after an outage do) and count
    the ones each worker accepted. With one shared socket, the worker that wakes first
    takes the whole burst; with a socket each, the kernel spreads them."""
    burst = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
    try:
        deadline = time.monotonic() + 10
        while True:
            held = [
                sum(1 for c in w.net_connections() if c.raddr and c.laddr.port == port)
                for w in workers
            ]
            if sum(held) >= connections or time.monotonic() > deadline:
                return held
            time.sleep(0.05)
    finally:
        for conn in burst:
            conn.close()


def test_serve_with_workers_shares_the_port_and_the_options(fresh_database_url: str) -> None:
    """`--workers 2`: two processes serve one port, each with the CLI's options (a device
    quota of 1 here) and a share of a burst of connections, and SIGTERM stops all of
    them."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    key = "workers-test-key-0123456789abcdef"
    cmd = [str(BIN / "engram-relay"), "serve", "--port", str(port), "--workers", "2",
           "--database-url", fresh_database_url, "--quota-devices", "1"]  # fmt: skip
    env = _env(SYNC_API_KEYS=f"{key}:100000")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        _wait_ready(url, proc)
        listeners = _listening_workers(proc.pid, port, want=2)
        assert len(listeners) == 2
        held = _connections_per_worker(port, listeners, connections=32)
        assert sum(held) == 32, held
        assert min(held) > 0, held  # each worker has its own socket
        sealer = Sealer("workers-vault")
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as http:
            for i in range(8):  # new connections: both workers take some
                http.headers["Connection"] = "close"
                assert push(http, "workers-vault", [sealer.blob(f"m{i}", 1)]).status_code == 200
            other = sealer.blob("other", 1, device_id="second-device")
            refused = push(http, "workers-vault", [other])
            assert refused.status_code == 402  # the --quota-devices of the parent
            assert pull_ok(http, "workers-vault", cursor=0)["cursor"] == 8
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not any(p.is_running() and p.status() != "zombie" for p in listeners)
