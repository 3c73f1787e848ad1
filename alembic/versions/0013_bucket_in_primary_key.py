"""The digest bucket in the primary key of `blobs` instead of an index of its own
(PROTOCOL §18, docs/digest.md "Costs and figures").

Revision 0010 kept `blobs.digest_bucket` with the index `(vault_id, digest_bucket)`, so
that one bucket of a vault is an index range. No update of a blob row is HOT (`seq`
changes every time), so that index took an entry for every row written, new memory or
replacement: figure 12 measured the push with the digest 11% slower than the push before
it, and 6.5% with the bucket in the primary key instead, in the same window.

- `digest_bucket` becomes NOT NULL; a row without one (written outside the push, which
  revision 0010 still allowed) gets it from `engram_digest_bucket`, only where there is
  such a row (on Citus the function is not needed on the workers otherwise).
- The primary key becomes `(vault_id, digest_bucket, memory_id)`. A memory's bucket is a
  function of its id, so this is exactly as unique as `(vault_id, memory_id)` was, as
  long as every writer computes the bucket (the push: `shared_format.digest.bucket_of`;
  SQL: `engram_digest_bucket`). Every lookup by memory id gives the bucket too.
- `blobs_digest_bucket_idx` is dropped: the key's `(vault_id, digest_bucket)` prefix is
  the bucket's range, ordered by memory id as the bucket lists are.

The key is rebuilt under an exclusive lock on `blobs` (seconds per million rows).

Revision ID: 0013_bucket_in_primary_key
Revises: 0012_bucket_prefixes
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013_bucket_in_primary_key"
down_revision: str | Sequence[str] | None = "0012_bucket_prefixes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = [
    "DO $$ BEGIN IF EXISTS (SELECT 1 FROM blobs WHERE digest_bucket IS NULL) THEN"
    " UPDATE blobs SET digest_bucket = engram_digest_bucket(memory_id)"
    " WHERE digest_bucket IS NULL; END IF; END $$",
    "ALTER TABLE blobs ALTER COLUMN digest_bucket SET NOT NULL",
    "ALTER TABLE blobs DROP CONSTRAINT blobs_pkey",
    "ALTER TABLE blobs ADD CONSTRAINT blobs_pkey PRIMARY KEY (vault_id, digest_bucket, memory_id)",
    "DROP INDEX blobs_digest_bucket_idx",
]

DOWNGRADE = [
    "CREATE INDEX blobs_digest_bucket_idx ON blobs (vault_id, digest_bucket)",
    "ALTER TABLE blobs DROP CONSTRAINT blobs_pkey",
    "ALTER TABLE blobs ADD CONSTRAINT blobs_pkey PRIMARY KEY (vault_id, memory_id)",
    "ALTER TABLE blobs ALTER COLUMN digest_bucket DROP NOT NULL",
]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
