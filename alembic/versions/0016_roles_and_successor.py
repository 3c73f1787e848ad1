"""Grant roles (PROTOCOL §13) and the successor statement (PROTOCOL §19), issue 31.

- `vault_grants.role`: `member` (the default: may mint member keys and store its wrap) or
  `admin` (may also mint admin keys, grant and revoke devices). Grants made before this
  revision become `member`: before it every grant was full admin, which is the hole this
  revision closes (docs/vault-ownership.md says how the owner gives `admin` back).
- `vaults.successor_statement`, `vaults.successor_stated_at`: the successor statement a
  re-keying device sends with `POST /v1/vaults/{v}/retire` (an HMAC under the old vault's
  hmac key, base64, and the `retired_at` text it covers). The relay cannot check them (it
  never holds the key): it stores them as opaque text and hands them back in the `retired`
  answer, and the follower checks them (docs/rekey.md "The successor statement").

Columns only: on Citus both tables stay distributed as they are.

Revision ID: 0016_roles_and_successor
Revises: 0015_vaults_fillfactor
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0016_roles_and_successor"
down_revision: str | Sequence[str] | None = "0015_vaults_fillfactor"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = [
    "ALTER TABLE vault_grants ADD COLUMN role text NOT NULL DEFAULT 'member'"
    " CONSTRAINT vault_grants_role CHECK (role IN ('member', 'admin'))",
    "ALTER TABLE vaults ADD COLUMN successor_statement text"
    " CONSTRAINT vaults_successor_statement_size CHECK (octet_length(successor_statement) <= 128),"
    " ADD COLUMN successor_stated_at text"
    " CONSTRAINT vaults_successor_stated_at_size CHECK (octet_length(successor_stated_at) <= 64)",
]

DOWNGRADE = [
    "ALTER TABLE vaults DROP COLUMN successor_stated_at, DROP COLUMN successor_statement",
    "ALTER TABLE vault_grants DROP COLUMN role",
]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
