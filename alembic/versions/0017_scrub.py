"""The background scrub of the stored digest (PROTOCOL §18, issue 35; relay.store.scrub).

- `vaults.scrubbed_at`: when the relay last recomputed the vault's digest, counts and
  bucket prefixes from its rows (NULL: never; the scrub takes the least recently scrubbed
  vault first, never-scrubbed ones before all).
- `vaults.scrub_mismatches`: how many scrubs of the vault found the stored values untrue
  (and made them true again), for `engram-relay vaults show`.

Columns only: on Citus `vaults` stays distributed as it is, no new key.

Revision ID: 0017_scrub
Revises: 0016_roles_and_successor
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0017_scrub"
down_revision: str | Sequence[str] | None = "0016_roles_and_successor"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = [
    "ALTER TABLE vaults ADD COLUMN scrubbed_at timestamptz,"
    " ADD COLUMN scrub_mismatches bigint NOT NULL DEFAULT 0",
]

DOWNGRADE = ["ALTER TABLE vaults DROP COLUMN scrub_mismatches, DROP COLUMN scrubbed_at"]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
