"""The relay's schema on Citus (issue 18): `engram-relay migrate --citus` on a real
coordinator with two workers (tests/citus_cluster.py), every table placed, and the hot
pull, push and digest statements planned as one task on one shard.

Skipped (with the reason) where Citus cannot be built; the build is cached outside the
repository, so after the first run the module costs the cluster's start-up (a few s).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from engram_sync.relay.db import citus
from engram_sync.relay.db.url import to_sqlalchemy_url
from engram_sync.relay.store.push import BLOB_UPSERT
from engram_sync.relay.store.sync import PULL_PAGE
from tests.citus_cluster import CitusCluster
from tests.conftest import scratch_database

RELAY = Path(sys.executable).with_name("engram-relay")


def _run_migrate(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RELAY), "migrate", "--database-url", url, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def migrated_url(citus_cluster: CitusCluster) -> Iterator[str]:
    """A database on the cluster migrated by the real `engram-relay migrate --citus`."""
    url = citus_cluster.create_database("citus_migrated")
    try:
        result = _run_migrate(url, "--citus")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "distributed on Citus" in result.stdout
        yield url
    finally:
        citus_cluster.drop_database("citus_migrated")


async def _fetch(url: str, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


def _shard_options(url: str, table: str) -> set[str]:
    """The storage parameters of each of the table's shards, as one set per shard joined
    by ';' (the workers' own `pg_class`)."""
    rows = asyncio.run(
        _fetch(
            url,
            "SELECT result FROM run_command_on_shards($1::regclass,"
            " $$SELECT array_to_string(reloptions, ',') FROM pg_class"
            " WHERE oid = '%s'::regclass$$)",
            table,
        )
    )
    return {r["result"] for r in rows}


def test_shards_of_vaults_keep_their_rows_on_their_page(migrated_url: str) -> None:
    # Revisions 0012 (toast_tuple_target) and 0015 (fillfactor) on a database distributed
    # at head: every shard of `vaults` has both, `blobs` neither.
    assert _shard_options(migrated_url, "vaults") == {"toast_tuple_target=8160,fillfactor=50"}
    assert _shard_options(migrated_url, "blobs") == {""}


def _placements(url: str) -> dict[str, citus.Placement]:
    engine = create_engine(to_sqlalchemy_url(url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return citus.placements(conn)
    finally:
        engine.dispose()


def test_every_table_is_distributed_by_vault_id_or_a_reference_table(migrated_url: str) -> None:
    tables = asyncio.run(
        _fetch(
            migrated_url,
            "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace"
            " AND relkind IN ('r', 'p')",
        )
    )
    names = {row["relname"] for row in tables}
    placed = _placements(migrated_url)
    assert names == set(placed), f"not placed: {sorted(names - set(placed))}"
    distributed = {t for t, p in placed.items() if p.method == "hash"}
    reference = {t for t, p in placed.items() if p.method == "reference"}
    assert distributed == set(citus.DISTRIBUTED_TABLES)
    assert reference == set(citus.REFERENCE_TABLES)
    assert {placed[t].column for t in distributed} == {"vault_id"}
    # colocated: one vault's rows of every table sit on one shard group
    assert len({placed[t].colocation_id for t in distributed}) == 1
    # and spread over both workers
    nodes = asyncio.run(
        _fetch(
            migrated_url,
            "SELECT DISTINCT nodeport FROM citus_shards WHERE table_name = 'blobs'::regclass",
        )
    )
    assert len(nodes) == 2


def test_migrate_again_places_nothing_and_keeps_rows(migrated_url: str) -> None:
    asyncio.run(_fetch(migrated_url, "INSERT INTO vaults (vault_id) VALUES ('again') RETURNING 1"))
    result = _run_migrate(migrated_url)  # detected: the database has the extension
    assert result.returncode == 0, result.stdout + result.stderr
    assert citus.distribute(migrated_url) == []
    rows = asyncio.run(_fetch(migrated_url, "SELECT vault_id FROM vaults WHERE vault_id = 'again'"))
    assert len(rows) == 1


def _explain(url: str, sql: str, *args: object) -> str:
    rows = asyncio.run(_fetch(url, "EXPLAIN " + sql, *args))
    return "\n".join(row[0] for row in rows)


def test_pull_by_cursor_is_one_task_on_one_shard(migrated_url: str) -> None:
    plan = _explain(migrated_url, PULL_PAGE, "vault-a", 0, 100, 1 << 20)
    assert "Task Count: 1\n" in plan + "\n", plan
    # the positive case next to it: a statement over every vault fans out
    everywhere = _explain(migrated_url, "SELECT count(*) FROM blobs")
    assert "Task Count: 1\n" not in everywhere + "\n", everywhere


def _one_blob_columns(vault_id: str = "vault-a") -> list[list[object]]:
    return [
        [vault_id],
        ["m1"],
        ["d1"],
        [1],
        ["c"],
        ["h"],
        ["2026-01-01T00:00:00Z"],
        [datetime(2026, 1, 1, tzinfo=UTC)],
        [False],
        [1],
        [1],
    ]


def test_push_upsert_for_one_vault_is_one_task_on_one_shard(migrated_url: str) -> None:
    plan = _explain(migrated_url, BLOB_UPSERT, *_one_blob_columns())
    assert "Task Count: 1\n" in plan + "\n", plan
    # the positive case next to it: the same rows without the vault row joined in leave
    # the shard (the form the push had before: deploy/SCALING.md §3)
    unjoined = (
        BLOB_UPSERT.replace("FROM vaults v, unnest", "FROM unnest")
        .replace("SELECT v.vault_id, u.memory_id", "SELECT u.vault_id, u.memory_id")
        .replace("WHERE v.vault_id = ($1::text[])[1] AND u.vault_id = v.vault_id", "")
    )
    assert "vaults v" not in unjoined
    plan = _explain(migrated_url, unjoined, *_one_blob_columns())
    assert "pull to coordinator" in plan, plan


def test_push_writes_on_citus_land_in_their_vault_only(migrated_url: str) -> None:
    async def scenario() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(migrated_url)
        try:
            await conn.execute(
                "INSERT INTO vaults (vault_id) VALUES ('w-1'), ('w-2') ON CONFLICT DO NOTHING"
            )
            async with conn.transaction():  # two vaults, two shards maybe: one commit
                for vault_id in ("w-1", "w-2"):
                    await conn.execute(BLOB_UPSERT, *_one_blob_columns(vault_id))
            # a row of another vault than the first one's is left out, not misfiled
            mixed = _one_blob_columns("w-1")
            mixed[0] = ["w-1", "w-2"]
            mixed[1:] = [column * 2 for column in mixed[1:]]
            mixed[1] = ["m2", "m3"]
            mixed[9] = [2, 3]  # seq, unique per vault
            await conn.execute(BLOB_UPSERT, *mixed)
            return list(
                await conn.fetch(
                    "SELECT vault_id, memory_id FROM blobs WHERE vault_id LIKE 'w-%'"
                    " ORDER BY vault_id, memory_id"
                )
            )
        finally:
            await conn.close()

    rows = [(r["vault_id"], r["memory_id"]) for r in asyncio.run(scenario())]
    assert rows == [("w-1", "m1"), ("w-1", "m2"), ("w-2", "m1")]


def test_migrate_citus_on_plain_postgresql_refuses_with_the_reason(postgres_url: str) -> None:
    with scratch_database(postgres_url) as url:  # plain PostgreSQL even with --citus-all
        result = _run_migrate(url, "--citus")
        assert result.returncode != 0
        assert "citus extension is not installed" in result.stdout + result.stderr
        # without the flag the same database migrates as before
        assert _run_migrate(url).returncode == 0


def test_schema_rules_flag_what_citus_cannot_place() -> None:
    good = citus._Schema(
        tables=[*citus.DISTRIBUTED_TABLES, *citus.REFERENCE_TABLES],
        unique_indexes=[("blobs", "blobs_pkey", "vault_id"), ("api_keys", "k", "key_hash")],
        foreign_keys=[
            ("blobs_vault_id_fkey", "blobs", "vaults", ["vault_id"], ["vault_id"]),
            ("vault_owners_account_id_fkey", "vault_owners", "accounts", ["account_id"], ["id"]),
        ],
    )
    assert citus._problems(good) == []
    bad = citus._Schema(
        tables=[*good.tables, "new_table"],
        unique_indexes=[*good.unique_indexes, ("blobs", "blobs_memory_key", "memory_id")],
        foreign_keys=[
            *good.foreign_keys,
            ("cross", "devices", "blobs", ["memory_id"], ["memory_id"]),
            ("ref_to_dist", "api_keys", "vaults", ["vault_id"], ["vault_id"]),
        ],
    )
    problems = " | ".join(citus._problems(bad))
    assert "table new_table is neither" in problems
    assert "blobs_memory_key of blobs is led by memory_id" in problems
    assert "foreign key cross" in problems
    assert "ref_to_dist" in problems


def test_a_database_with_rows_keeps_them_when_distributed(citus_cluster: CitusCluster) -> None:
    # An existing relay database moved to Citus: migrated as plain tables, rows in, then placed.
    from alembic import command

    from engram_sync.relay.db.migrate import alembic_config

    url = citus_cluster.create_database("citus_existing")
    try:
        command.upgrade(alembic_config(url), "head")
        asyncio.run(
            _fetch(
                url,
                "WITH v AS (INSERT INTO vaults (vault_id, seq) VALUES ('old', 1) RETURNING 1)"
                " INSERT INTO blobs (vault_id, memory_id, device_id, vector_clock, ciphertext,"
                " hmac, created_at, created_at_ts, deleted, seq, size_bytes)"
                " VALUES ('old', 'm', 'd', 1, 'c', 'h', 'x', now(), false, 1, 1) RETURNING 1",
            )
        )
        placed = citus.distribute(url)
        assert set(placed) == set(citus.DISTRIBUTED_TABLES) | set(citus.REFERENCE_TABLES)
        rows = asyncio.run(_fetch(url, "SELECT memory_id FROM blobs"))
        assert [row["memory_id"] for row in rows] == ["m"]
        pull = asyncio.run(_fetch(url, PULL_PAGE, "old", 0, 100, 1 << 20))
        assert [row["memory_id"] for row in pull] == ["m"]
    finally:
        citus_cluster.drop_database("citus_existing")


def test_revision_0012_backfills_a_distributed_database(citus_cluster: CitusCluster) -> None:
    # A relay already on Citus at 0011 migrated to 0012: the bucket prefixes and counts
    # are filled from the rows of the distributed tables (PROTOCOL §18).
    from alembic import command

    from engram_sync.relay.db.migrate import alembic_config
    from tests.relay.bucket_oracle import oracle, stored

    url = citus_cluster.create_database("citus_0012")
    try:
        command.upgrade(alembic_config(url), "0011_relay_processes")
        citus.distribute(url)

        async def fill() -> None:
            conn = await asyncpg.connect(url)
            try:
                await conn.execute("INSERT INTO vaults (vault_id) VALUES ('x'), ('y'), ('e')")
                for vault_id, n in (("x", 40), ("y", 7)):
                    await conn.execute(
                        "INSERT INTO blobs (vault_id, memory_id, device_id, vector_clock,"
                        " ciphertext, hmac, created_at, created_at_ts, deleted, seq, size_bytes,"
                        " digest_bucket) SELECT $1, 'm' || i, 'd', i, 'c', 'h', 'x', now(),"
                        " i % 3 = 0, i, 1, engram_digest_bucket('m' || i)"
                        " FROM generate_series(1, $2) AS i",
                        vault_id,
                        n,
                    )
            finally:
                await conn.close()

        async def read() -> list[tuple[tuple[bytes, list[int]], tuple[bytes, list[int]]]]:
            conn = await asyncpg.connect(url)
            try:
                return [(await stored(conn, v), await oracle(conn, v)) for v in ("x", "y", "e")]
            finally:
                await conn.close()

        asyncio.run(fill())
        command.upgrade(alembic_config(url), "head")
        x, y, e = asyncio.run(read())
        assert x[0] == x[1]
        assert y[0] == y[1]
        assert sum(x[0][1]) == 40
        assert e[0] == (bytes(2048), [0] * 256)
    finally:
        citus_cluster.drop_database("citus_0012")


def test_revisions_0013_and_0014_rebuild_the_key_of_a_distributed_database(
    citus_cluster: CitusCluster,
) -> None:
    # A relay already on Citus at 0012 migrated to 0013: a row without a bucket gets it,
    # and the distributed table's primary key holds the bucket (PROTOCOL §18); then to
    # 0014: the key is (vault_id, memory_id) again, the column gone, the rows kept.
    from alembic import command

    from engram_sync.relay.db.migrate import alembic_config
    from engram_sync.shared_format.digest import bucket_of

    url = citus_cluster.create_database("citus_0013")
    try:
        command.upgrade(alembic_config(url), "0012_bucket_prefixes")
        citus.distribute(url)
        insert = (
            "INSERT INTO blobs (vault_id, memory_id, device_id, vector_clock, ciphertext, hmac,"
            " created_at, created_at_ts, deleted, seq, size_bytes, digest_bucket)"
            " VALUES ('x', $1, 'd', 1, 'c', 'h', 'x', now(), false, $2, 1, $3)"
        )
        asyncio.run(_fetch(url, "INSERT INTO vaults (vault_id) VALUES ('x') RETURNING 1"))
        asyncio.run(_fetch(url, insert + " RETURNING 1", "m1", 1, bucket_of("m1")))
        asyncio.run(_fetch(url, insert + " RETURNING 1", "outside", 2, None))
        command.upgrade(alembic_config(url), "0013_bucket_in_primary_key")
        rows = asyncio.run(_fetch(url, "SELECT memory_id, digest_bucket FROM blobs ORDER BY 1"))
        want = [("m1", bucket_of("m1")), ("outside", bucket_of("outside"))]
        assert [tuple(r) for r in rows] == want
        key = asyncio.run(
            _fetch(url, "SELECT indexdef FROM pg_indexes WHERE indexname = 'blobs_pkey'")
        )
        assert key[0]["indexdef"].endswith("(vault_id, digest_bucket, memory_id)")
        with pytest.raises(asyncpg.UniqueViolationError):  # still one row per memory
            asyncio.run(_fetch(url, insert + " RETURNING 1", "m1", 3, bucket_of("m1")))
        command.upgrade(alembic_config(url), "head")
        key = asyncio.run(
            _fetch(url, "SELECT indexdef FROM pg_indexes WHERE indexname = 'blobs_pkey'")
        )
        assert key[0]["indexdef"].endswith("(vault_id, memory_id)")
        rows = asyncio.run(_fetch(url, "SELECT * FROM blobs ORDER BY memory_id"))
        assert [r["memory_id"] for r in rows] == ["m1", "outside"]
        assert "digest_bucket" not in rows[0]
        unbucketed = insert.replace(", digest_bucket)", ")").replace(", $3)", ")")
        with pytest.raises(asyncpg.UniqueViolationError):  # one row per memory
            asyncio.run(_fetch(url, unbucketed + " RETURNING 1", "m1", 3))
        asyncio.run(_fetch(url, unbucketed + " RETURNING 1", "m2", 3))  # a new one is taken
        # 0015 on the distributed table reaches its shards
        assert _shard_options(url, "vaults") == {"toast_tuple_target=8160,fillfactor=50"}
    finally:
        citus_cluster.drop_database("citus_0013")


@pytest.mark.parametrize(
    ("module", "name", "args"),
    [
        pytest.param("push", "_LOCK_VAULT", ("vault-a",), id="push-lock"),
        pytest.param("push", "_READ_VAULTS", (["vault-a"],), id="push-read"),
        pytest.param(
            "push",
            "_UPDATE_VAULT",
            ("vault-a", 1, 1, 1, 0, bytes(32), bytes(2048), bytes(1024)),
            id="push-vault",
        ),
        pytest.param("push", "_SEEN_DEVICES", ("vault-a", ["d1"]), id="push-devices"),
        pytest.param("push", "_READ_KNOWN", ("vault-a", ["d1"], ["m1"]), id="push-known"),
        pytest.param("digest", "_VAULT", ("vault-a",), id="digest-vault"),
        pytest.param("digest", "_BUCKET_PREFIXES", ("vault-a",), id="digest-buckets-stored"),
        pytest.param("digest", "_FETCH", ("vault-a", ["m1"]), id="digest-fetch"),
        pytest.param("digest", "_BUCKETS", ("vault-a", None), id="digest-buckets"),
        pytest.param("digest", "_BUCKETS", ("vault-a", 3), id="digest-bucket"),
        pytest.param("digest", "_LIST", ("vault-a", 3, "", 100), id="digest-list"),
        pytest.param("digest", "_NARROW", ("vault-a", 3, bytes(2048), "", 100), id="digest-narrow"),
        pytest.param("scrub", "_LOCK_VAULT", ("vault-a",), id="scrub-lock"),
        pytest.param("scrub", "_ROW_TOTALS", ("vault-a",), id="scrub-rows"),
        pytest.param(
            "scrub",
            "_REPAIR",
            ("vault-a", bytes(32), 1, 0, bytes(2048), bytes(1024), 0),
            id="scrub-repair",
        ),
    ],
)
def test_hot_statement_for_one_vault_is_one_task(
    migrated_url: str, module: str, name: str, args: tuple[object, ...]
) -> None:
    import importlib

    statement = getattr(importlib.import_module(f"engram_sync.relay.store.{module}"), name, None)
    if statement is None:
        pytest.skip(f"relay.store.{module}.{name} is gone: update this list")
    plan = _explain(migrated_url, statement, *args)
    assert "Task Count: 1\n" in plan + "\n", plan
