"""The digest bucket as a plain column written by the push (PROTOCOL §18, docs/digest.md).

Revision 0008 made `blobs.digest_bucket` a STORED generated column over
`engram_digest_bucket(memory_id)` (SHA-256 in SQL for every written row) with the index
`(vault_id, digest_bucket, memory_id)`. What keeping the digest costs a push is cut here:

- the column stays, with its values, as a plain column (`DROP EXPRESSION`: no table
  rewrite); relay.store.push writes it, computed in Python (`shared_format.digest.
  bucket_of`) next to the version hashes it already makes. It stays nullable so that a
  row written outside the push (a test, a restore tool) is still accepted; such a row is
  outside every bucket, as it is outside the stored digest the push keeps.
- the index becomes `(vault_id, digest_bucket)`: a smaller key per row (deduplicated,
  since a vault has 256 keys), still the bucket's index range for the bucket answers;
  their ordering by memory_id is a sort of that one bucket's rows.

Backfill: the kept values are those of the generated column; a row without one (none,
unless written between revisions by hand) gets it from `engram_digest_bucket`.

Revision ID: 0010_digest_bucket_column
Revises: 0009_retire
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010_digest_bucket_column"
down_revision: str | Sequence[str] | None = "0009_retire"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = [
    "ALTER TABLE blobs ALTER COLUMN digest_bucket DROP EXPRESSION",
    "UPDATE blobs SET digest_bucket = engram_digest_bucket(memory_id) WHERE digest_bucket IS NULL",
    "DROP INDEX blobs_digest_bucket_idx",
    "CREATE INDEX blobs_digest_bucket_idx ON blobs (vault_id, digest_bucket)",
]

DOWNGRADE = [
    "DROP INDEX blobs_digest_bucket_idx",
    "ALTER TABLE blobs DROP COLUMN digest_bucket",
    "ALTER TABLE blobs ADD COLUMN digest_bucket smallint"
    " GENERATED ALWAYS AS (engram_digest_bucket(memory_id)) STORED",
    "CREATE INDEX blobs_digest_bucket_idx ON blobs (vault_id, digest_bucket, memory_id)",
]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
