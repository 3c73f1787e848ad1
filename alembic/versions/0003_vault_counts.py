"""Live-blob and tombstone counts per vault, kept by the push transaction.

/health (`total_blobs`: live blobs, PROTOCOL §5) and a vault's stats used to count
rows of `blobs`, which on a large relay is a scan of the whole table every refresh
(every 10 s, per process) and of the whole vault per stats call; the scans stalled
concurrent pushes. The push transaction already holds the vault row's lock and knows
each blob's previous state, so it keeps these two counts exactly, like `bytes_used`;
compaction lowers `tombstones`. This migration fills them from the existing rows.

Revision ID: 0003_vault_counts
Revises: 0002_accounts
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003_vault_counts"
down_revision: str | Sequence[str] | None = "0002_accounts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = [
    "ALTER TABLE vaults ADD COLUMN live_blobs bigint NOT NULL DEFAULT 0 CHECK (live_blobs >= 0)",
    "ALTER TABLE vaults ADD COLUMN tombstones bigint NOT NULL DEFAULT 0 CHECK (tombstones >= 0)",
    """
    UPDATE vaults v SET live_blobs = c.live, tombstones = c.dead
    FROM (SELECT vault_id, count(*) FILTER (WHERE NOT deleted) AS live,
                 count(*) FILTER (WHERE deleted) AS dead
          FROM blobs GROUP BY vault_id) c
    WHERE v.vault_id = c.vault_id
    """,
]

DOWNGRADE = [
    "ALTER TABLE vaults DROP COLUMN tombstones",
    "ALTER TABLE vaults DROP COLUMN live_blobs",
]


def upgrade() -> None:
    """Add the counts and fill them from the blobs already stored."""
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    """Drop the counts again (back to 0002_accounts)."""
    for statement in DOWNGRADE:
        op.execute(statement)
