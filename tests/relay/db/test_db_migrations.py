"""Alembic migrations: they apply, are idempotent, and build the specified schema."""

from __future__ import annotations

import asyncio
import re
import secrets
from typing import Any

import asyncpg
import pytest
from alembic import command

from engram_sync.relay.db.migrate import (
    alembic_config,
    alembic_dir,
    current_revision,
    head_revision,
    upgrade_to_head,
)
from engram_sync.relay.store.push import _UPDATE_VAULT
from engram_sync.shared_format.digest import bucket_of

VAULT_TABLES = ("vaults", "blobs", "devices", "quotas")
ALL_TABLES = (*VAULT_TABLES, "api_keys")

# table -> column -> (data type, nullable, default or None)
EXPECTED_COLUMNS: dict[str, dict[str, tuple[str, bool, str | None]]] = {
    "vaults": {
        "vault_id": ("text", False, None),
        "seq": ("bigint", False, "0"),
        "created_at": ("timestamp with time zone", False, "now()"),
        "compacted_through": ("bigint", False, "0"),
        "bytes_used": ("bigint", False, "0"),
        "live_blobs": ("bigint", False, "0"),  # 0003_vault_counts
        "tombstones": ("bigint", False, "0"),
        "digest": ("bytea", False, "decode(repeat('00'::text, 32), 'hex'::text)"),  # 0008_digest
        "retired_at": ("timestamp with time zone", True, None),  # 0009_retire (PROTOCOL §19)
        "successor": ("text", True, None),
        "erase_after": ("timestamp with time zone", True, None),
        # 0012_bucket_prefixes (PROTOCOL §18): ?buckets=1 stored
        "bucket_prefixes": ("bytea", False, "decode(repeat('00'::text, 2048), 'hex'::text)"),
        "bucket_counts": ("bytea", False, "decode(repeat('00'::text, 1024), 'hex'::text)"),
        # 0016 (PROTOCOL §19): the re-keying device's successor statement, opaque to the relay
        "successor_statement": ("text", True, None),
        "successor_stated_at": ("text", True, None),
        # 0017_scrub (PROTOCOL §18, issue 35): the last scrub and the mismatches it found
        "scrubbed_at": ("timestamp with time zone", True, None),
        "scrub_mismatches": ("bigint", False, "0"),
    },
    "blobs": {
        "vault_id": ("text", False, None),
        "memory_id": ("text", False, None),
        "device_id": ("text", False, None),
        "vector_clock": ("bigint", False, None),
        "ciphertext": ("text", False, None),
        "hmac": ("text", False, None),
        "created_at": ("text", False, None),
        "created_at_ts": ("timestamp with time zone", False, None),
        "deleted": ("boolean", False, None),
        "seq": ("bigint", False, None),
        "received_at": ("timestamp with time zone", False, "now()"),
        "size_bytes": ("integer", False, None),
        # digest_bucket: 0008_digest to 0013 (in the primary key), gone since 0014
    },
    "devices": {
        "vault_id": ("text", False, None),
        "device_id": ("text", False, None),
        "label": ("text", True, None),
        "first_seen": ("timestamp with time zone", False, "now()"),
        "last_seen": ("timestamp with time zone", False, "now()"),
        "blob_count": ("bigint", False, "0"),
        "revoked_at": ("timestamp with time zone", True, None),
        "pulled_cursor": ("bigint", False, "0"),
        "pulled_at": ("timestamp with time zone", True, None),
    },
    "api_keys": {
        "id": ("text", False, None),
        "key_hash": ("bytea", False, None),
        "prefix": ("text", False, None),
        "vault_id": ("text", True, None),
        "is_admin": ("boolean", False, "false"),
        "device_id": ("text", True, None),
        "rate_per_sec": ("integer", False, "100"),
        "label": ("text", True, None),
        "created_at": ("timestamp with time zone", False, "now()"),
        "revoked_at": ("timestamp with time zone", True, None),
        "account_id": ("text", True, None),  # 0002_accounts: keys minted from a session
    },
    "quotas": {
        "vault_id": ("text", False, None),
        "max_devices": ("integer", True, None),
        "max_bytes": ("bigint", True, None),
    },
}

EXPECTED_PRIMARY_KEYS = {
    "vaults": ["vault_id"],
    "blobs": ["vault_id", "memory_id"],  # 0014_bucket_out_of_blobs (0013 had the bucket)
    "devices": ["vault_id", "device_id"],
    "api_keys": ["id"],
    "quotas": ["vault_id"],
}


def run(coro: Any) -> Any:
    """Run one coroutine to completion (fixtures and tests are synchronous)."""
    return asyncio.run(coro)


async def fetch(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def execute(url: str, sql: str, *args: Any) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()


def schema_snapshot(url: str) -> dict[str, Any]:
    """Columns, indexes and constraints of the public schema, for comparisons."""
    columns = fetch(
        url,
        """SELECT table_name, column_name, data_type, is_nullable, column_default
           FROM information_schema.columns WHERE table_schema = 'public'
           ORDER BY table_name, ordinal_position""",
    )
    indexes = fetch(
        url,
        "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
        "ORDER BY indexname",
    )
    constraints = fetch(
        url,
        """SELECT conrelid::regclass::text AS tbl, conname, pg_get_constraintdef(oid) AS def
           FROM pg_constraint WHERE connamespace = 'public'::regnamespace ORDER BY conname""",
    )
    return {
        "columns": [tuple(r) for r in run(columns)],
        "indexes": [tuple(r) for r in run(indexes)],
        "constraints": [tuple(r) for r in run(constraints)],
    }


def indexdefs(url: str, table: str) -> dict[str, str]:
    rows = run(
        fetch(
            url,
            "SELECT indexname, indexdef FROM pg_indexes "
            "WHERE schemaname = 'public' AND tablename = $1",
            table,
        )
    )
    return {r["indexname"]: r["indexdef"] for r in rows}


def test_head_is_the_generation_revision() -> None:
    assert (alembic_dir() / "env.py").is_file()
    assert head_revision() == "0019_vault_passkey_wraps"


def test_generation_is_one_random_row(fresh_database_url: str) -> None:
    """0004 (PROTOCOL §17): one row, 32 hex characters, never a second row."""
    url = fresh_database_url
    rows = run(fetch(url, "SELECT generation FROM relay_meta"))
    assert len(rows) == 1
    generation = rows[0]["generation"]
    assert re.fullmatch("[0-9a-f]{32}", generation)
    with pytest.raises(asyncpg.UniqueViolationError):
        run(execute(url, "INSERT INTO relay_meta (generation) VALUES (repeat('a', 32))"))
    with pytest.raises(asyncpg.CheckViolationError):
        run(execute(url, "INSERT INTO relay_meta VALUES (false, repeat('a', 32))"))
    with pytest.raises(asyncpg.CheckViolationError):
        run(execute(url, "UPDATE relay_meta SET generation = 'not hex'"))


def test_each_migrated_database_gets_its_own_generation(empty_database_url: str) -> None:
    """0004 on a relay from before it, after a downgrade and up again: a new id each time."""
    url = empty_database_url
    command.upgrade(alembic_config(url), "0003_vault_counts")
    upgrade_to_head(url)
    first = run(fetch(url, "SELECT generation FROM relay_meta"))[0]["generation"]
    command.downgrade(alembic_config(url), "0003_vault_counts")
    tables = run(fetch(url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))
    assert "relay_meta" not in {r["tablename"] for r in tables}
    upgrade_to_head(url)
    second = run(fetch(url, "SELECT generation FROM relay_meta"))[0]["generation"]
    assert first != second


def test_vault_counts_are_filled_from_existing_blobs(empty_database_url: str) -> None:
    """0003 on a relay that already holds blobs: the counts start out right."""
    url = empty_database_url
    command.upgrade(alembic_config(url), "0002_accounts")
    blob = (
        "INSERT INTO blobs (vault_id, memory_id, device_id, vector_clock, ciphertext, hmac,"
        " created_at, created_at_ts, deleted, seq, size_bytes) VALUES ($1, $2, 'd', 1, 'c',"
        " 'h', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', $3, $4, 1)"
    )

    async def fill() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("INSERT INTO vaults (vault_id) VALUES ('a'), ('b'), ('empty')")
            for seq, (vault, deleted) in enumerate(
                [("a", False), ("a", False), ("a", True), ("b", True)], start=1
            ):
                await conn.execute(blob, vault, f"m{seq}", deleted, seq)
        finally:
            await conn.close()

    run(fill())
    upgrade_to_head(url)
    rows = run(fetch(url, "SELECT vault_id, live_blobs, tombstones FROM vaults ORDER BY 1"))
    assert [tuple(r) for r in rows] == [("a", 2, 1), ("b", 0, 1), ("empty", 0, 0)]


def test_0013_puts_the_bucket_in_the_primary_key_and_fills_missing_buckets(
    empty_database_url: str,
) -> None:
    """0013 on a relay that holds rows, one of them without a bucket (0010 allowed it):
    every row gets its bucket, the key is (vault_id, digest_bucket, memory_id), the
    bucket's own index is gone; the downgrade gives the 0012 key and index back."""
    url = empty_database_url
    command.upgrade(alembic_config(url), "0012_bucket_prefixes")
    blob = (
        "INSERT INTO blobs (vault_id, memory_id, device_id, vector_clock, ciphertext, hmac,"
        " created_at, created_at_ts, deleted, seq, size_bytes, digest_bucket) VALUES ($1, $2,"
        " 'd', 1, 'c', 'h', 'x', now(), false, $3, 1, {bucket})"
    )

    async def fill() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("INSERT INTO vaults (vault_id) VALUES ('a')")
            await conn.execute(blob.format(bucket="engram_digest_bucket($2)"), "a", "m1", 1)
            await conn.execute(blob.format(bucket="NULL"), "a", "outside", 2)
        finally:
            await conn.close()

    run(fill())
    before = indexdefs(url, "blobs")
    assert "blobs_digest_bucket_idx" in before
    command.upgrade(alembic_config(url), "0013_bucket_in_primary_key")
    rows = run(fetch(url, "SELECT memory_id, digest_bucket FROM blobs ORDER BY memory_id"))
    assert [(r["memory_id"], r["digest_bucket"]) for r in rows] == [
        ("m1", bucket_of("m1")),
        ("outside", bucket_of("outside")),  # filled by the upgrade
    ]
    after = indexdefs(url, "blobs")
    assert "blobs_digest_bucket_idx" not in after
    assert after["blobs_pkey"].endswith("(vault_id, digest_bucket, memory_id)")
    command.downgrade(alembic_config(url), "0012_bucket_prefixes")
    again = indexdefs(url, "blobs")
    assert again["blobs_pkey"].endswith("(vault_id, memory_id)")
    assert again["blobs_digest_bucket_idx"] == before["blobs_digest_bucket_idx"]


def test_0014_takes_the_bucket_out_of_blobs_and_the_downgrade_fills_it_again(
    empty_database_url: str,
) -> None:
    """0014 on a relay at 0013 that holds rows: the rows stay, the key is (vault_id,
    memory_id) and the bucket column is gone; the downgrade gives the column back, each
    row's bucket filled from its id, in the 0013 key."""
    url = empty_database_url
    command.upgrade(alembic_config(url), "0013_bucket_in_primary_key")
    ids = [f"m{i}" for i in range(20)]

    async def fill() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("INSERT INTO vaults (vault_id) VALUES ('a')")
            for seq, memory_id in enumerate(ids, start=1):
                await conn.execute(
                    "INSERT INTO blobs (vault_id, memory_id, device_id, vector_clock,"
                    " ciphertext, hmac, created_at, created_at_ts, deleted, seq, size_bytes,"
                    " digest_bucket) VALUES ('a', $1, 'd', 1, 'c', 'h', 'x', now(), false, $2,"
                    " 1, engram_digest_bucket($1))",
                    memory_id,
                    seq,
                )
        finally:
            await conn.close()

    run(fill())
    assert indexdefs(url, "blobs")["blobs_pkey"].endswith("(vault_id, digest_bucket, memory_id)")
    upgrade_to_head(url)
    assert indexdefs(url, "blobs")["blobs_pkey"].endswith("(vault_id, memory_id)")
    columns = run(
        fetch(url, "SELECT column_name FROM information_schema.columns WHERE table_name = $1",
              "blobs")
    )  # fmt: skip
    assert "digest_bucket" not in {r["column_name"] for r in columns}
    assert "memory_id" in {r["column_name"] for r in columns}
    rows = run(fetch(url, "SELECT memory_id FROM blobs ORDER BY seq"))
    assert [r["memory_id"] for r in rows] == ids
    command.downgrade(alembic_config(url), "0013_bucket_in_primary_key")
    key = indexdefs(url, "blobs")["blobs_pkey"]
    assert key.endswith("(vault_id, digest_bucket, memory_id)"), key
    rows = run(fetch(url, "SELECT memory_id, digest_bucket FROM blobs ORDER BY seq"))
    assert [(r["memory_id"], r["digest_bucket"]) for r in rows] == [(m, bucket_of(m)) for m in ids]
    assert len({r["digest_bucket"] for r in rows}) > 1  # not one value for every row


def _pages_grown_by_pushes(url: str, vault_id: str, pushes: int) -> int:
    """Pages `vaults` grows by over `pushes` updates of one vault's row by the push's own
    statement, each its own transaction, with new random bucket prefixes as a push
    writes them (incompressible, like real ones)."""

    async def go() -> int:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("INSERT INTO vaults (vault_id) VALUES ($1)", vault_id)
            size = "SELECT pg_relation_size('vaults') / current_setting('block_size')::int"
            before = await conn.fetchval(size)
            for n in range(1, pushes + 1):
                await conn.execute(
                    _UPDATE_VAULT, vault_id, n, n, n, 0, secrets.token_bytes(32),
                    secrets.token_bytes(2048), bytes(1024),
                )  # fmt: skip
            grown: int = await conn.fetchval(size) - before
            return grown
        finally:
            await conn.close()

    return int(run(go()))


def test_0015_keeps_a_busy_vault_row_on_its_page(empty_database_url: str) -> None:
    """Revision 0015 (fillfactor 50): 300 pushes to one vault leave `vaults` as large as it
    was (each update a HOT one, its page pruned in time); at 0014 the same pushes grew it
    by a page every second push. The downgrade resets the parameter."""
    url = empty_database_url
    command.upgrade(alembic_config(url), "0014_bucket_out_of_blobs")
    assert _pages_grown_by_pushes(url, "at-0014", 300) >= 100
    upgrade_to_head(url)
    options = "SELECT reloptions FROM pg_class WHERE relname = 'vaults'"
    assert "fillfactor=50" in run(fetch(url, options))[0]["reloptions"]
    assert _pages_grown_by_pushes(url, "at-0015", 300) <= 1
    command.downgrade(alembic_config(url), "0014_bucket_out_of_blobs")
    # and 0012's toast_tuple_target stays
    assert run(fetch(url, options))[0]["reloptions"] == ["toast_tuple_target=8160"]


def test_upgrade_fresh_database_reaches_head(empty_database_url: str) -> None:
    assert current_revision(empty_database_url) is None
    upgrade_to_head(empty_database_url)
    assert current_revision(empty_database_url) == head_revision()


def test_upgrade_twice_is_a_noop(fresh_database_url: str) -> None:
    before = schema_snapshot(fresh_database_url)
    run(execute(fresh_database_url, "INSERT INTO vaults (vault_id) VALUES ('v1')"))
    upgrade_to_head(fresh_database_url)
    assert current_revision(fresh_database_url) == head_revision()
    assert schema_snapshot(fresh_database_url) == before
    rows = run(fetch(fresh_database_url, "SELECT vault_id FROM vaults"))
    assert [r["vault_id"] for r in rows] == ["v1"]


def test_downgrade_to_base_and_back(fresh_database_url: str) -> None:
    config = alembic_config(fresh_database_url)
    command.downgrade(config, "base")
    assert current_revision(fresh_database_url) is None
    tables = run(
        fetch(fresh_database_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    )
    assert {r["tablename"] for r in tables} <= {"alembic_version"}
    upgrade_to_head(fresh_database_url)
    assert current_revision(fresh_database_url) == head_revision()


def test_columns_match_the_spec(fresh_database_url: str) -> None:
    rows = run(
        fetch(
            fresh_database_url,
            """SELECT table_name, column_name, data_type, is_nullable, column_default
               FROM information_schema.columns
               WHERE table_schema = 'public' AND table_name = ANY($1::text[])""",
            list(ALL_TABLES),
        )
    )
    actual: dict[str, dict[str, tuple[str, bool, str | None]]] = {}
    for r in rows:
        actual.setdefault(r["table_name"], {})[r["column_name"]] = (
            r["data_type"],
            r["is_nullable"] == "YES",
            r["column_default"],
        )
    assert actual == EXPECTED_COLUMNS


@pytest.mark.parametrize(("table", "columns"), sorted(EXPECTED_PRIMARY_KEYS.items()))
def test_primary_keys(fresh_database_url: str, table: str, columns: list[str]) -> None:
    rows = run(
        fetch(
            fresh_database_url,
            """SELECT a.attname FROM pg_index i
               JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, pos) ON true
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
               WHERE i.indrelid = $1::regclass AND i.indisprimary ORDER BY k.pos""",
            table,
        )
    )
    assert [r["attname"] for r in rows] == columns


def test_blob_indexes(fresh_database_url: str) -> None:
    defs = indexdefs(fresh_database_url, "blobs")
    assert (
        "CREATE UNIQUE INDEX blobs_vault_id_seq_key ON public.blobs USING btree (vault_id, seq)"
        in (defs.values())
    )
    assert (
        "CREATE INDEX blobs_vault_id_created_at_ts_seq_idx "
        "ON public.blobs USING btree (vault_id, created_at_ts, seq)"
    ) in defs.values()
    assert (
        "CREATE INDEX blobs_tombstones_idx ON public.blobs USING btree (vault_id, seq) "
        "WHERE deleted"
    ) in defs.values()


def test_api_key_indexes(fresh_database_url: str) -> None:
    defs = " | ".join(indexdefs(fresh_database_url, "api_keys").values())
    assert "CREATE INDEX api_keys_vault_id_idx ON public.api_keys USING btree (vault_id)" in defs
    assert (
        "CREATE UNIQUE INDEX api_keys_key_hash_key ON public.api_keys USING btree (key_hash)"
        in (defs)
    )


@pytest.mark.parametrize("table", VAULT_TABLES)
def test_vault_id_leads_every_vault_scoped_index(fresh_database_url: str, table: str) -> None:
    defs = indexdefs(fresh_database_url, table)
    assert defs
    for name, definition in defs.items():
        assert "USING btree (vault_id" in definition, name


def test_defaults_and_constraints(fresh_database_url: str) -> None:
    url = fresh_database_url

    async def scenario() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("INSERT INTO vaults (vault_id) VALUES ('v')")
            vault = await conn.fetchrow("SELECT * FROM vaults")
            assert (vault["seq"], vault["compacted_through"], vault["bytes_used"]) == (0, 0, 0)
            blob = (
                "INSERT INTO blobs (vault_id, memory_id, device_id, vector_clock, ciphertext,"
                " hmac, created_at, created_at_ts, deleted, seq, size_bytes)"
                " VALUES ($1, $2, 'd', 1, 'c', 'h', '2026-01-01T00:00:00+00:00',"
                " '2026-01-01T00:00:00+00:00', false, $3, 1)"
            )
            await conn.execute(blob, "v", "m1", 1)
            with pytest.raises(asyncpg.UniqueViolationError):
                await conn.execute(blob, "v", "m2", 1)  # seq unique per vault
            with pytest.raises(asyncpg.UniqueViolationError):
                await conn.execute(blob, "v", "m1", 2)  # one row per memory
            with pytest.raises(asyncpg.ForeignKeyViolationError):
                await conn.execute(blob, "no-such-vault", "m3", 1)
            await conn.execute("INSERT INTO devices (vault_id, device_id) VALUES ('v', 'd')")
            device = await conn.fetchrow("SELECT * FROM devices")
            assert (device["blob_count"], device["pulled_cursor"]) == (0, 0)
            assert device["revoked_at"] is None
            key = (
                "INSERT INTO api_keys (id, key_hash, prefix, vault_id, device_id)"
                " VALUES ($1, $2, 'p', $3, $4)"
            )
            await conn.execute(key, "k1", b"\x01" * 32, "v", "d")
            row = await conn.fetchrow("SELECT is_admin, rate_per_sec FROM api_keys")
            assert (row["is_admin"], row["rate_per_sec"]) == (False, 100)
            with pytest.raises(asyncpg.UniqueViolationError):
                await conn.execute(key, "k2", b"\x01" * 32, "v", None)
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute(key, "k3", b"\x03" * 32, None, "d")  # bound key needs a vault
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute(key, "k4", b"\x04" * 8, "v", None)  # not a sha256
            await conn.execute("INSERT INTO quotas (vault_id) VALUES ('v')")
            quota = await conn.fetchrow("SELECT * FROM quotas")
            assert (quota["max_devices"], quota["max_bytes"]) == (None, None)
        finally:
            await conn.close()

    run(scenario())


def test_each_test_gets_its_own_empty_database(fresh_database_url: str) -> None:
    rows = run(
        fetch(fresh_database_url, "SELECT current_database() AS db, count(*) AS n FROM vaults")
    )
    assert rows[0]["db"].startswith("test_")
    assert rows[0]["n"] == 0


def test_concurrent_upgrades_do_not_race(empty_database_url: str) -> None:
    """Several replicas starting at once: the advisory lock serialises the migrations."""
    import threading

    from engram_sync.relay.db.migrate import current_revision, head_revision, upgrade_to_head

    errors: list[BaseException] = []

    def run() -> None:
        try:
            upgrade_to_head(empty_database_url)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert current_revision(empty_database_url) == head_revision()
