"""The pairing-code authentication of the team handoff (PROTOCOL §14 step 4, docs/handoff.md).

A request made with a pairing code carries the requester's SPAKE2 message and the
code's public id (SHA-256 hex of the part the relay redeems, which the relay
already stores); its seal carries the admin's SPAKE2 message and `seal_auth`, the
HMAC over request id, both public keys and the seal. All four are public values or
authenticators, never key material: SPAKE2 messages allow no offline guess of the
code's secret part. `admin_pake` and `seal_auth` are erased with the seal (claim,
expiry). Requests without a pairing code leave all four NULL.

Revision ID: 0005_handoff_pake
Revises: 0004_generation
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005_handoff_pake"
down_revision: str | Sequence[str] | None = "0004_generation"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = [
    "ALTER TABLE handoff_requests ADD COLUMN requester_pake text",
    "ALTER TABLE handoff_requests ADD COLUMN pairing_id text CHECK (pairing_id ~ '^[0-9a-f]{64}$')",
    "ALTER TABLE handoff_requests ADD COLUMN admin_pake text",
    "ALTER TABLE handoff_requests ADD COLUMN seal_auth text",
    # Both or neither, on each side; an admin message only with a seal, and only for a
    # request that was made with a pairing code.
    "ALTER TABLE handoff_requests ADD CONSTRAINT handoff_requests_pake_pair"
    " CHECK ((requester_pake IS NULL) = (pairing_id IS NULL))",
    "ALTER TABLE handoff_requests ADD CONSTRAINT handoff_requests_seal_auth_pair"
    " CHECK ((admin_pake IS NULL) = (seal_auth IS NULL))",
    "ALTER TABLE handoff_requests ADD CONSTRAINT handoff_requests_seal_auth_sealed"
    " CHECK (admin_pake IS NULL OR (sealed IS NOT NULL AND requester_pake IS NOT NULL))",
]

DOWNGRADE = [
    "ALTER TABLE handoff_requests DROP CONSTRAINT handoff_requests_seal_auth_sealed",
    "ALTER TABLE handoff_requests DROP CONSTRAINT handoff_requests_seal_auth_pair",
    "ALTER TABLE handoff_requests DROP CONSTRAINT handoff_requests_pake_pair",
    "ALTER TABLE handoff_requests DROP COLUMN seal_auth",
    "ALTER TABLE handoff_requests DROP COLUMN admin_pake",
    "ALTER TABLE handoff_requests DROP COLUMN pairing_id",
    "ALTER TABLE handoff_requests DROP COLUMN requester_pake",
]


def upgrade() -> None:
    """Add the four nullable columns and their constraints (no rewrite of existing rows)."""
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    """Drop them again (back to 0004_generation)."""
    for statement in DOWNGRADE:
        op.execute(statement)
