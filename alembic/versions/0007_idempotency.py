"""Idempotency keys: a retried request that creates something answers what the first one made.

`idempotency_keys` holds one row per (scope, route, Idempotency-Key) for 24 hours
(docs/retries.md, relay/domain/idempotency_keys.py). The relay stores no key and no answer in the
clear: `lookup` is a SHA-256 over the scope, the route and the client's key; `request_mac`
an HMAC of the request body under a key derived from the client's key (a sign-up body
holds a password); `answer` the first answer sealed with AES-GCM under another key
derived from it. Without the client's key a database dump shows neither the minted API
keys and session tokens in the answers nor anything to test passwords against.

Revision ID: 0007_idempotency
Revises: 0006_vault_ownership
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007_idempotency"
down_revision: str | Sequence[str] | None = "0006_vault_ownership"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = [
    """
    CREATE TABLE idempotency_keys (
        lookup      bytea       PRIMARY KEY CHECK (length(lookup) = 32),
        request_mac bytea       NOT NULL CHECK (length(request_mac) = 32),
        answer      bytea       NOT NULL,
        created_at  timestamptz NOT NULL DEFAULT now(),
        expires_at  timestamptz NOT NULL
    )
    """,
    "CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at)",
]

DOWNGRADE = ["DROP TABLE idempotency_keys"]


def upgrade() -> None:
    """Create the table (empty: nothing before this revision sent an Idempotency-Key)."""
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    """Drop it again (back to 0006_vault_ownership)."""
    for statement in DOWNGRADE:
        op.execute(statement)
