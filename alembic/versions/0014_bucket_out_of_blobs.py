"""The digest bucket out of `blobs` again: the primary key `(vault_id, memory_id)` of
revision 0001, no `digest_bucket` column (PROTOCOL §18, docs/digest.md "Costs and
figures").

Revisions 0008-0013 kept each row's bucket in `blobs` (a generated column, then one the
push wrote, then in the primary key) so that one bucket of a vault was an index range.
Every push paid for it: the column and its array in the blob upsert, a three-column key
probed and written for every blob. Figure 12 (bench.digest_push) measured the push with
the digest +4.8% against before it with the bucket in the key, and a relay with the
digest's hashing made a no-op but the column and key kept +5.2%: the layout, not the
hashing, was what stood above the 2% of issue 16. The bucket answers need no column:
`?buckets=1` reads the stored prefixes and counts (revision 0012), and a bucket's digest,
list or narrowing computes each row's bucket from its id (`relay.store.digest.
bucket_of_sql`), a pass over the vault's rows on the repair path only (0.3-0.7 s for
1,000,000 memories, bench.anti_entropy).

The key is rebuilt under an exclusive lock on `blobs` (seconds per million rows).
`engram_digest_bucket` (0008) stays: the downgrade fills the column with it.

Revision ID: 0014_bucket_out_of_blobs
Revises: 0013_bucket_in_primary_key
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014_bucket_out_of_blobs"
down_revision: str | Sequence[str] | None = "0013_bucket_in_primary_key"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = [
    "ALTER TABLE blobs DROP CONSTRAINT blobs_pkey",
    "ALTER TABLE blobs ADD CONSTRAINT blobs_pkey PRIMARY KEY (vault_id, memory_id)",
    "ALTER TABLE blobs DROP COLUMN digest_bucket",
]

# Back to 0013: the column filled (only where there are rows: on Citus the function is
# then not needed on the workers), NOT NULL, and in the key.
DOWNGRADE = [
    "ALTER TABLE blobs ADD COLUMN digest_bucket smallint",
    "DO $$ BEGIN IF EXISTS (SELECT 1 FROM blobs) THEN"
    " UPDATE blobs SET digest_bucket = engram_digest_bucket(memory_id); END IF; END $$",
    "ALTER TABLE blobs ALTER COLUMN digest_bucket SET NOT NULL",
    "ALTER TABLE blobs DROP CONSTRAINT blobs_pkey",
    "ALTER TABLE blobs ADD CONSTRAINT blobs_pkey PRIMARY KEY (vault_id, digest_bucket, memory_id)",
]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
