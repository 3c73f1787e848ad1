"""Vault retirement (PROTOCOL §19, docs/rekey.md "Relay").

Three columns on `vaults` (on Citus the table stays distributed by vault_id: columns
only, no new key):

- `retired_at`: when `POST /v1/vaults/{v}/retire` committed; NULL while the vault is live.
  From then on every push is refused 410 `vault_retired` (relay.store.push reads it in
  the statement that locks the vault row, so no push commits after the retire commits).
- `successor`: the vault id the retire named, or NULL (a hint for devices, never trusted
  by a client).
- `erase_after`: `retired_at` + the grace period (ENGRAM_RETIRE_GRACE_DAYS, default 30).
  Pulls keep working until then and carry `retired`; after it every route of the vault
  answers 410 and the maintenance round erases the blobs (the row stays as a tombstone
  of the retirement).

The partial index holds the retired vaults only, so the maintenance round reads them
without a scan of every vault.

Revision ID: 0009_retire
Revises: 0008_digest
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009_retire"
down_revision: str | Sequence[str] | None = "0008_digest"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = [
    "ALTER TABLE vaults ADD COLUMN retired_at timestamptz,"
    " ADD COLUMN successor text, ADD COLUMN erase_after timestamptz",
    "ALTER TABLE vaults ADD CONSTRAINT vaults_retired_erase_after"
    " CHECK ((retired_at IS NULL) = (erase_after IS NULL))",
    "ALTER TABLE vaults ADD CONSTRAINT vaults_successor_of_retired"
    " CHECK (successor IS NULL OR (retired_at IS NOT NULL AND successor <> vault_id))",
    # vault_id leads, as in every vault-scoped index (the Citus distribution column).
    "CREATE INDEX vaults_retired_idx ON vaults (vault_id, erase_after)"
    " WHERE retired_at IS NOT NULL",
]

DOWNGRADE = [
    "DROP INDEX vaults_retired_idx",
    "ALTER TABLE vaults DROP CONSTRAINT vaults_successor_of_retired,"
    " DROP CONSTRAINT vaults_retired_erase_after",
    "ALTER TABLE vaults DROP COLUMN erase_after, DROP COLUMN successor, DROP COLUMN retired_at",
]


def upgrade() -> None:
    """Add the retirement columns, their checks and the maintenance index."""
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    """Drop them again (back to 0008_digest)."""
    for statement in DOWNGRADE:
        op.execute(statement)
