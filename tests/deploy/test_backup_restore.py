"""`engram-relay backup` / `restore`: real pg_dump and pg_restore against the test PostgreSQL."""

from __future__ import annotations

import asyncio
import secrets
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from typer.testing import CliRunner

from engram_sync.relay.cli.backup import OpsError, pick_tool, split_password
from engram_sync.relay.cli.main import app
from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.store.minted_keys import create_key
from tests.conftest import _execute, database_url_for
from tests.deploy.support import BIN, child_env


def relay_cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(BIN / "engram-relay"), *args],
        env=child_env(),
        input=stdin,
        capture_output=True,
        timeout=120,
        check=False,
    )


def relay_in_process(*args: str) -> tuple[int, str]:
    """The same command in this process (faster): its exit code and stderr."""
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stderr


def sql(url: str, *statements: str) -> None:
    async def go() -> None:
        conn = await asyncpg.connect(to_libpq_url(url))
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(go())


def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    async def go() -> dict[str, list[tuple[Any, ...]]]:
        conn = await asyncpg.connect(to_libpq_url(url))
        try:
            queries = {
                "vaults": "SELECT vault_id, seq, bytes_used FROM vaults ORDER BY 1",
                "blobs": "SELECT vault_id, memory_id, ciphertext, deleted, seq FROM blobs"
                " ORDER BY 1, 2",
                "keys": "SELECT id, key_hash, vault_id, revoked_at FROM api_keys ORDER BY 1",
                "alembic": "SELECT version_num FROM alembic_version",
            }
            return {name: [tuple(r) for r in await conn.fetch(q)] for name, q in queries.items()}
        finally:
            await conn.close()

    return asyncio.run(go())


def generation(url: str) -> str | None:
    """The database's relay generation (PROTOCOL §17), None without relay_meta."""

    async def go() -> str | None:
        conn = await asyncpg.connect(to_libpq_url(url))
        try:
            if not await conn.fetchval("SELECT to_regclass('public.relay_meta') IS NOT NULL"):
                return None
            value: str = await conn.fetchval("SELECT generation FROM relay_meta")
            return value
        finally:
            await conn.close()

    return asyncio.run(go())


def seed(url: str) -> None:
    blob = (
        "INSERT INTO blobs (vault_id, memory_id, device_id, vector_clock, ciphertext, hmac,"
        " created_at, created_at_ts, deleted, seq, size_bytes) VALUES"
        " ('vault-a', '{m}', 'dev-1', {seq}, '{c}', 'hmac', '2026-01-01T00:00:00Z',"
        " '2026-01-01T00:00:00Z', {deleted}, {seq}, 4)"
    )
    sql(
        url,
        "INSERT INTO vaults (vault_id, seq, bytes_used) VALUES ('vault-a', 2, 8)",
        blob.format(m="m1", seq=1, c="Y2lwaGVy", deleted="false"),
        blob.format(m="m2", seq=2, c="", deleted="true"),
    )

    async def key() -> None:
        conn = await asyncpg.connect(to_libpq_url(url))
        try:
            await create_key(conn, vault_id="vault-a", is_admin=True, label="backup test")
        finally:
            await conn.close()

    asyncio.run(key())


@pytest.fixture
def second_database(postgres_url: str) -> Iterator[str]:
    name = f"test_{secrets.token_hex(8)}"
    asyncio.run(_execute(postgres_url, f'CREATE DATABASE "{name}"'))
    try:
        yield database_url_for(postgres_url, name)
    finally:
        asyncio.run(_execute(postgres_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def test_backup_then_restore_brings_the_data_back(
    fresh_database_url: str, second_database: str, tmp_path: Path
) -> None:
    url = fresh_database_url
    seed(url)
    before = snapshot(url)
    backed_up = generation(url)
    assert backed_up is not None
    dump = tmp_path / "relay.dump"

    made = relay_cli("backup", "--output", str(dump), "--database-url", url)
    assert made.returncode == 0, made.stderr
    assert dump.read_bytes().startswith(b"PGDMP")  # pg_dump's custom format
    assert stat.S_IMODE(dump.stat().st_mode) == 0o600
    assert not list(tmp_path.glob(".*partial*"))

    code, stderr = relay_in_process("backup", "--output", str(dump), "--database-url", url)
    assert code == 2
    assert "--force" in stderr

    # Lose a blob, add a vault, revoke the key.
    sql(
        url,
        "DELETE FROM blobs WHERE memory_id = 'm1'",
        "INSERT INTO vaults (vault_id) VALUES ('vault-b')",
        "UPDATE api_keys SET revoked_at = now()",
    )
    changed = snapshot(url)
    assert changed != before

    code, stderr = relay_in_process("restore", "--input", str(dump), "--database-url", url)
    assert code == 2
    assert "not empty" in stderr
    assert "--yes" in stderr
    assert snapshot(url) == changed  # nothing touched
    assert generation(url) == backed_up

    restored = relay_cli("restore", "--input", str(dump), "--yes", "--database-url", url)
    assert restored.returncode == 0, restored.stderr
    assert snapshot(url) == before
    # PROTOCOL §17: the data is the backup's, the generation is new, so devices that
    # synced with the lost state notice the restore.
    renewed = generation(url)
    assert renewed is not None
    assert renewed != backed_up
    assert renewed.encode() in restored.stderr

    # Into an empty database: no --yes needed.
    fresh = relay_cli("restore", "--input", str(dump), "--database-url", second_database)
    assert fresh.returncode == 0, fresh.stderr
    assert snapshot(second_database) == before
    assert generation(second_database) not in (None, backed_up, renewed)


def test_restore_refuses_while_another_client_is_connected_unless_forced(
    fresh_database_url: str, tmp_path: Path
) -> None:
    """Issue 14 (15): `restore --yes` replaced the database under a running relay. A
    session on the database (here one like a relay's pool) now stops it, unless --force."""
    url = fresh_database_url
    seed(url)
    dump = tmp_path / "relay.dump"
    made = relay_cli("backup", "--output", str(dump), "--database-url", url)
    assert made.returncode == 0, made.stderr
    sql(url, "INSERT INTO vaults (vault_id) VALUES ('after-backup')")
    changed = snapshot(url)

    loop = asyncio.new_event_loop()
    relay_session = loop.run_until_complete(
        asyncpg.connect(to_libpq_url(url), server_settings={"application_name": "engram-relay"})
    )
    try:
        code, stderr = relay_in_process("restore", "-i", str(dump), "--yes", "--database-url", url)
        assert code == 2
        assert "1 other client(s) are connected" in stderr
        assert "engram-relay (" in stderr
        assert "--force" in stderr
        assert "Traceback" not in stderr
        assert snapshot(url) == changed  # nothing touched

        code, stderr = relay_in_process(
            "restore", "-i", str(dump), "--yes", "--force", "--database-url", url
        )
        assert code == 0, stderr
        assert snapshot(url) != changed
    finally:
        loop.run_until_complete(relay_session.close())
        loop.close()

    # nobody else connected: --yes alone restores
    code, stderr = relay_in_process("restore", "-i", str(dump), "--yes", "--database-url", url)
    assert code == 0, stderr


def test_backup_and_restore_stream_through_stdout_and_stdin(fresh_database_url: str) -> None:
    url = fresh_database_url
    seed(url)
    before = snapshot(url)
    made = relay_cli("backup", "--output", "-", "--database-url", url)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith(b"PGDMP")
    sql(url, "DELETE FROM blobs")
    restored = relay_cli("restore", "-i", "-", "--yes", "--database-url", url, stdin=made.stdout)
    assert restored.returncode == 0, restored.stderr
    assert snapshot(url) == before


def test_a_restore_that_cannot_renew_the_generation_fails_loudly(
    fresh_database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Data restored but the backup's generation kept would hide the restore from every
    device (PROTOCOL §17): the command must not report success."""
    url = fresh_database_url
    seed(url)
    dump = tmp_path / "relay.dump"
    assert relay_in_process("backup", "-o", str(dump), "--database-url", url)[0] == 0
    backed_up = generation(url)

    async def broken(conn: asyncpg.Connection) -> str:
        raise ConnectionResetError("connection lost")

    monkeypatch.setattr("engram_sync.relay.cli.backup.new_generation", broken)
    code, stderr = relay_in_process("restore", "-i", str(dump), "--yes", "--database-url", url)
    assert code == 1
    assert "devices would not notice the restore" in stderr
    assert "run this restore again" in stderr
    assert generation(url) == backed_up


def test_a_backup_from_before_generations_gets_one_at_the_next_migration(
    empty_database_url: str, second_database: str, tmp_path: Path
) -> None:
    from alembic import command

    from engram_sync.relay.db.migrate import alembic_config, upgrade_to_head

    command.upgrade(alembic_config(empty_database_url), "0003_vault_counts")
    dump = tmp_path / "old.dump"
    made = relay_in_process("backup", "-o", str(dump), "--database-url", empty_database_url)
    assert made[0] == 0
    code, stderr = relay_in_process("restore", "-i", str(dump), "--database-url", second_database)
    assert code == 0, stderr
    assert "predates relay generations" in stderr
    assert generation(second_database) is None
    upgrade_to_head(second_database)  # what `engram-relay serve` does at its start
    assert generation(second_database) is not None


def test_restore_refuses_what_it_cannot_restore_cleanly(
    fresh_database_url: str, tmp_path: Path
) -> None:
    url = fresh_database_url
    garbage = tmp_path / "garbage.dump"
    garbage.write_bytes(b"not a dump at all")
    code, stderr = relay_in_process("restore", "-i", str(garbage), "--yes", "--database-url", url)
    assert code == 2
    assert "not a backup pg_restore can read" in stderr

    missing = str(tmp_path / "no.dump")
    code, stderr = relay_in_process("restore", "-i", missing, "--database-url", url)
    assert code == 2
    assert "no such file" in stderr

    # A table the backup lacks would survive --clean and leave a mixed schema.
    dump = tmp_path / "relay.dump"
    assert relay_in_process("backup", "-o", str(dump), "--database-url", url)[0] == 0
    sql(url, "CREATE TABLE added_later (x int)")
    code, stderr = relay_in_process("restore", "-i", str(dump), "--yes", "--database-url", url)
    assert code == 2
    assert "added_later" in stderr


def test_split_password_keeps_the_password_off_the_command_line() -> None:
    target, env = split_password("postgresql+psycopg://relay:p%40ss@db:5432/relay?sslmode=require")
    assert target == "postgresql://relay@db:5432/relay?sslmode=require"
    assert env == {"PGPASSWORD": "p@ss"}
    target, env = split_password("postgres://relay@db/relay?password=x&application_name=a")
    assert target == "postgresql://relay@db/relay?application_name=a"
    assert env == {"PGPASSWORD": "x"}
    assert split_password("postgresql://relay@db/relay") == ("postgresql://relay@db/relay", {})


def fake_tool(directory: Path, name: str, major: int) -> Path:
    path = directory / f"{name}-{major}"
    path.write_text(f"#!/bin/sh\necho '{name} (PostgreSQL) {major}.3'\n")
    path.chmod(0o755)
    return path


def test_pick_tool_prefers_the_servers_major_version(tmp_path: Path) -> None:
    v15, v17, v18 = (fake_tool(tmp_path, "pg_dump", m) for m in (15, 17, 18))
    assert pick_tool("pg_dump", 17, [v18, v15, v17], older_ok=False) == v17
    assert pick_tool("pg_dump", 16, [v18, v15, v17], older_ok=False) == v17  # closest newer
    with pytest.raises(OpsError, match="no pg_dump for PostgreSQL 19"):
        pick_tool("pg_dump", 19, [v18, v15], older_ok=False)
    assert pick_tool("pg_restore", 19, [v15, v18], older_ok=True) == v18
    with pytest.raises(OpsError, match="pg_dump not found"):
        pick_tool("pg_dump", 17, [], older_ok=False)
