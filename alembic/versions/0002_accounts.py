"""Accounts, sessions, key wraps, pairing codes and team key handoff (PROTOCOL §13, §14).

Zero knowledge: the relay stores login hashes (Argon2id PHC strings), hashes of
session tokens and pairing codes, opaque wraps and salts, a hash of the
recovery proof, public keys and sealed ciphertext — never a password, A or K.

Keys: handoff_requests is keyed (vault_id, request_id) and pairing_codes has a
(vault_id, ...) index, so vault_id leads the vault-scoped keys; pairing_codes'
primary key stays code_hash because redeeming a code does not name a vault.
vault_wraps is keyed by account (account_id, vault_id) with a vault_id index.

Revision ID: 0002_accounts
Revises: 0001_initial
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002_accounts"
down_revision: str | Sequence[str] | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


UPGRADE = [
    # PROTOCOL §13: email stored lowercased and trimmed; password_hash is the
    # login hash (Argon2id m=19456, t=2, p=1), never usable as a wrap key.
    """
    CREATE TABLE accounts (
        id            text        PRIMARY KEY,
        email         text        NOT NULL UNIQUE
                      CHECK (email = lower(btrim(email)) AND email <> ''),
        password_hash text        NOT NULL CHECK (password_hash LIKE '$argon2id$%'),
        created_at    timestamptz NOT NULL DEFAULT now()
    )
    """,
    # Bearer session tokens, stored only as SHA-256 of the token text.
    """
    CREATE TABLE sessions (
        token_hash bytea       PRIMARY KEY CHECK (octet_length(token_hash) = 32),
        account_id text        NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
        created_at timestamptz NOT NULL DEFAULT now(),
        expires_at timestamptz NOT NULL
    )
    """,
    "CREATE INDEX sessions_account_id_idx ON sessions (account_id)",
    "CREATE INDEX sessions_expires_at_idx ON sessions (expires_at)",
    # Opaque standard-base64 wraps of A (§13). rec_verifier = SHA-256(recovery
    # proof), see shared_format/recovery_proof.py: it authorises POST /auth/recover.
    """
    CREATE TABLE account_wraps (
        account_id    text        PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
        wrapped_a     text,
        salt_pw       text,
        wrapped_a_rec text,
        salt_rec      text,
        rec_verifier  bytea       CHECK (octet_length(rec_verifier) = 32),
        updated_at    timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT account_wraps_password_pair CHECK ((wrapped_a IS NULL) = (salt_pw IS NULL)),
        CONSTRAINT account_wraps_recovery_set CHECK (
            (wrapped_a_rec IS NULL) = (salt_rec IS NULL)
            AND (wrapped_a_rec IS NULL) = (rec_verifier IS NULL)
        )
    )
    """,
    # Wraps of vault keys K under A (§13). Holding one makes the account an owner
    # of the vault (admin through keys it mints, may issue pairing codes).
    """
    CREATE TABLE vault_wraps (
        account_id text        NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
        vault_id   text        NOT NULL,
        wrapped_k  text        NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (account_id, vault_id)
    )
    """,
    "CREATE INDEX vault_wraps_vault_id_idx ON vault_wraps (vault_id, account_id)",
    # Keys minted from a session belong to the account (listed and revocable by it).
    "ALTER TABLE api_keys ADD COLUMN account_id text REFERENCES accounts (id)",
    "CREATE INDEX api_keys_account_id_idx ON api_keys (account_id) WHERE account_id IS NOT NULL",
    # One-time pairing codes, stored only as SHA-256 of the normalised code.
    # created_by = "key:<key id>" or "account:<account id>".
    """
    CREATE TABLE pairing_codes (
        code_hash          bytea       PRIMARY KEY CHECK (octet_length(code_hash) = 32),
        vault_id           text        NOT NULL,
        label              text,
        device_bound       boolean     NOT NULL DEFAULT true,
        created_by         text        NOT NULL,
        created_at         timestamptz NOT NULL DEFAULT now(),
        expires_at         timestamptz NOT NULL,
        redeemed_at        timestamptz,
        redeemed_device_id text
    )
    """,
    "CREATE INDEX pairing_codes_vault_id_expires_at_idx ON pairing_codes (vault_id, expires_at)",
    "CREATE INDEX pairing_codes_expires_at_idx ON pairing_codes (expires_at)",
    # Team key handoff mailbox (§14): public keys and one seal, erased on claim or
    # expiry. No fingerprint column: it is recomputed from public_key on every read.
    """
    CREATE TABLE handoff_requests (
        vault_id         text        NOT NULL,
        request_id       text        NOT NULL,
        public_key       text        NOT NULL,
        label            text        NOT NULL DEFAULT '',
        requester_key_id text        NOT NULL,
        created_at       timestamptz NOT NULL DEFAULT now(),
        expires_at       timestamptz NOT NULL,
        admin_public_key text,
        sealed           text,
        sealed_at        timestamptz,
        claimed_at       timestamptz,
        PRIMARY KEY (vault_id, request_id),
        CONSTRAINT handoff_requests_seal_pair CHECK ((sealed IS NULL) = (admin_public_key IS NULL))
    )
    """,
    "CREATE INDEX handoff_requests_expires_at_idx ON handoff_requests (expires_at)",
]

DOWNGRADE = [
    "DROP TABLE handoff_requests",
    "DROP TABLE pairing_codes",
    "DROP INDEX api_keys_account_id_idx",
    "ALTER TABLE api_keys DROP COLUMN account_id",
    "DROP TABLE vault_wraps",
    "DROP TABLE account_wraps",
    "DROP TABLE sessions",
    "DROP TABLE accounts",
]


def upgrade() -> None:
    """Create the account, pairing and handoff tables."""
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    """Drop them again (back to 0001_initial)."""
    for statement in DOWNGRADE:
        op.execute(statement)
