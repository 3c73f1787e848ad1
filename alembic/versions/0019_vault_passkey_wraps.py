"""Passkey wraps of passphrase vaults (issue 34; docs/web-vault.md "Passkey unlock", our
addition to PROTOCOL §13, wire-additive).

`vault_passkey_wraps`: per vault and WebAuthn credential id, K (the §13 layout enc ‖ hmac ‖
vault_id) wrapped under a key the browser derives from the passkey's PRF output (opaque
standard base64, the §13 envelope, at most 512 decoded bytes) and the PRF salt (public,
16..64 bytes). Stored under a vault API key's auth (no account): the passphrase vault's
counterpart of `passkey_wraps`. The relay never sees the PRF output, its derived key or K.
Keyed by vault first (distributed with `vaults` on Citus); an erased vault loses them.

Revision ID: 0019_vault_passkey_wraps
Revises: 0018_passkey_wraps
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0019_vault_passkey_wraps"
down_revision: str | Sequence[str] | None = "0018_passkey_wraps"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = [
    """
    CREATE TABLE vault_passkey_wraps (
        vault_id      text        NOT NULL,
        credential_id text        NOT NULL CHECK (credential_id <> ''),
        wrapped_k     text        NOT NULL,
        prf_salt      text        NOT NULL,
        created_at    timestamptz NOT NULL DEFAULT now(),
        updated_at    timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (vault_id, credential_id)
    )
    """,
]

DOWNGRADE = ["DROP TABLE vault_passkey_wraps"]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
