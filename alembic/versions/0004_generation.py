"""The relay generation: a random id of this database's history (PROTOCOL §17).

One row, made here when the database is first migrated (or when a database from
before this revision is next started) and replaced by ``engram-relay restore``. The
relay sends it in /v1/info and in every push and pull answer; a device that sees it
change treats the relay as restored (re-pulls from cursor 0, re-pushes what the relay
lacks). ``singleton`` is a primary key that can only be true, so the table holds at
most one row.

Revision ID: 0004_generation
Revises: 0003_vault_counts
Create Date: 2026-12-02
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_generation"
down_revision: str | Sequence[str] | None = "0003_vault_counts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CREATE = """
    CREATE TABLE relay_meta (
        singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
        generation text        NOT NULL CHECK (generation ~ '^[0-9a-f]{32}$'),
        changed_at timestamptz NOT NULL DEFAULT now()
    )
"""


def upgrade() -> None:
    """Create the table and its one row with a fresh generation (16 random bytes, hex)."""
    op.execute(CREATE)
    op.execute(
        sa.text("INSERT INTO relay_meta (generation) VALUES (:generation)").bindparams(
            generation=secrets.token_hex(16)
        )
    )


def downgrade() -> None:
    """Drop the table again (back to 0003_vault_counts)."""
    op.execute("DROP TABLE relay_meta")
