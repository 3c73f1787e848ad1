"""The 256 bucket prefixes and counts, stored on the vault row (PROTOCOL §18, docs/digest.md).

`GET /v1/vaults/{v}/digest?buckets=1` answered from one grouped pass over every row of the
vault, hashing each in SQL (139 s for 1,000,000 rows, past the client's timeout). Kept
instead, like `vaults.digest` (revision 0008), by the push and compaction under the vault
row lock they already take:

- `vaults.bucket_prefixes bytea`: 256 x 8 = 2,048 bytes, the first 8 bytes of each bucket's
  digest in bucket order. The digest is an XOR, bytewise, so the prefix of an XOR is the
  XOR of the prefixes: a blob changes its bucket's 8 bytes by (old version ^ new) >> 192.
- `vaults.bucket_counts bytea`: the 256 bucket sizes, each a big-endian u32 (as
  `int4send` writes it), 1,024 bytes. Not an `int4[]`: measured on 128 one-blob vault
  updates a group (bench/bucket_prefix_push.py and docs/digest.md "Costs and figures"),
  reading and writing the array cost +190% of the vault statements against +38% for the
  bytea: asyncpg encodes and decodes 256 array elements per vault, and the larger row
  is toasted. A bucket of one vault never nears 2^32 rows.
- `vaults` gets `toast_tuple_target = 8160`: the 3 KB of the two columns stay in the row
  instead of going out of line to TOAST (the vault statements of a 128-vault group +11%
  against +38% with the default target), at about two vault rows a page.

Both NOT NULL with a constant default of zeros (the empty vault): no table rewrite
(PostgreSQL 11's fast defaults; the two named checks read the vault rows once, one row
per vault). A row whose `digest_bucket` is NULL (written outside the push: revision 0010)
is in no bucket, as today.

Backfill: every vault that holds rows, from its rows, in SQL, exactly as
`relay.store.digest._BUCKETS` computes them (`backfill()`; tests/relay/store/test_bucket_prefixes.py
checks it against the pushes and bench/anti_entropy.py sets its SQL-built vault with it).
On Citus (vaults and blobs distributed by vault_id, colocated) the grouped subquery is
keyed by vault_id and joined on it, so it runs on the shards.

Revision ID: 0012_bucket_prefixes
Revises: 0011_relay_processes
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0012_bucket_prefixes"
down_revision: str | Sequence[str] | None = "0011_relay_processes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FIRST_WORD = (
    "bit_xor(('x' || encode(substr(engram_version_hash(memory_id, device_id, vector_clock,"
    " deleted), 1, 8), 'hex'))::bit(64)::bigint)"
)


def backfill(vault_filter: str = "true", bucket: str = "digest_bucket") -> str:
    """The UPDATE setting both columns from the rows of the vaults `vault_filter` (an SQL
    condition on `vault_id`) picks; a vault without rows keeps its zeros. `bucket`: each
    row's bucket, an SQL expression (the column here; computed from the memory id since
    revision 0014 took the column out, `relay.store.digest.bucket_of_sql`)."""
    return f"""
    WITH per AS (
        SELECT vault_id, bucket, count(*) AS n, {_FIRST_WORD} AS w
        FROM (SELECT *, {bucket} AS bucket FROM blobs WHERE {vault_filter}) b
        WHERE bucket IS NOT NULL
        GROUP BY vault_id, bucket
    ), filled AS (
        SELECT p.vault_id,
               string_agg(int8send(coalesce(per.w, 0)), ''::bytea ORDER BY s.bucket) AS prefixes,
               string_agg(int4send(coalesce(per.n, 0)::int4), ''::bytea ORDER BY s.bucket)
                   AS counts
        FROM (SELECT DISTINCT vault_id FROM per) p
        CROSS JOIN generate_series(0, 255) AS s(bucket)
        LEFT JOIN per ON per.vault_id = p.vault_id AND per.bucket = s.bucket
        GROUP BY p.vault_id
    )
    UPDATE vaults SET bucket_prefixes = f.prefixes, bucket_counts = f.counts
    FROM filled f WHERE vaults.vault_id = f.vault_id
    """  # noqa: S608 - constants only


# The checks are added by name, each in its own statement: Citus refuses a column added
# with an unnamed constraint on a distributed table.
UPGRADE = [
    "ALTER TABLE vaults ADD COLUMN bucket_prefixes bytea NOT NULL"
    " DEFAULT decode(repeat('00', 2048), 'hex')",
    "ALTER TABLE vaults ADD CONSTRAINT vaults_bucket_prefixes_check"
    " CHECK (length(bucket_prefixes) = 2048)",
    "ALTER TABLE vaults ADD COLUMN bucket_counts bytea NOT NULL"
    " DEFAULT decode(repeat('00', 1024), 'hex')",
    "ALTER TABLE vaults ADD CONSTRAINT vaults_bucket_counts_check"
    " CHECK (length(bucket_counts) = 1024)",
    "ALTER TABLE vaults SET (toast_tuple_target = 8160)",
    backfill(),
]

DOWNGRADE = [
    "ALTER TABLE vaults RESET (toast_tuple_target)",
    "ALTER TABLE vaults DROP COLUMN bucket_counts",
    "ALTER TABLE vaults DROP COLUMN bucket_prefixes",
]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
