"""The live relay processes, so a key's rate limit holds across replicas (issue 18).

One row per running relay process (each `--workers` worker, each replica): a random
`process_id` made at start-up, a `label` for operators (host name and pid, nothing
secret) and a heartbeat the periodic health refresh writes (relay.store.replicas).
`expires_at` is the heartbeat plus three of the writer's own refresh periods, so
processes with different periods still agree on who is alive. Every process counts the
rows not yet expired and enforces rate/N of each key locally (relay.domain.ratelimit); a
process that stops cleanly deletes its row, one that crashes expires.

No vault id: on Citus a reference table (relay.db.citus, deploy/SCALING.md §1).

Revision ID: 0011_relay_processes
Revises: 0010_digest_bucket_column
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011_relay_processes"
down_revision: str | Sequence[str] | None = "0010_digest_bucket_column"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = [
    "CREATE TABLE relay_processes ("
    " process_id text PRIMARY KEY CHECK (length(process_id) BETWEEN 1 AND 64),"
    " label text NOT NULL DEFAULT '' CHECK (length(label) <= 300),"
    " started_at timestamptz NOT NULL DEFAULT now(),"
    " heartbeat_at timestamptz NOT NULL DEFAULT now(),"
    " expires_at timestamptz NOT NULL)",
]

DOWNGRADE = ["DROP TABLE relay_processes"]


def upgrade() -> None:
    """Create the table of live relay processes."""
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    """Drop it (back to 0010_digest_bucket_column)."""
    for statement in DOWNGRADE:
        op.execute(statement)
