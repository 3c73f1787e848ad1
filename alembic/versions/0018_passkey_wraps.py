"""Passkey wraps of vault keys (issue 34 slice 4; docs/web-vault.md "Passkey unlock", our
addition to PROTOCOL §13).

`passkey_wraps`: per account, vault and WebAuthn credential id, K wrapped under a key the
browser derives from the passkey's PRF output (opaque standard base64, the §13 envelope, at
most 512 decoded bytes) and the PRF salt (public, 16..64 bytes). The relay never sees the PRF
output, its derived key or K. Keyed like vault_wraps, by account first; deleting the account
deletes its passkey wraps.

Revision ID: 0018_passkey_wraps
Revises: 0017_scrub
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0018_passkey_wraps"
down_revision: str | Sequence[str] | None = "0017_scrub"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = [
    """
    CREATE TABLE passkey_wraps (
        account_id    text        NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
        vault_id      text        NOT NULL,
        credential_id text        NOT NULL CHECK (credential_id <> ''),
        wrapped_k     text        NOT NULL,
        prf_salt      text        NOT NULL,
        created_at    timestamptz NOT NULL DEFAULT now(),
        updated_at    timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (account_id, vault_id, credential_id)
    )
    """,
]

DOWNGRADE = ["DROP TABLE passkey_wraps"]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
