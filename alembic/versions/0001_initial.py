# Revision files are named <rev>_<slug> (alembic.ini file_template).
"""Initial relay schema: vaults, blobs, devices, api_keys, quotas.

vault_id leads every vault-scoped primary key and index, so these tables can
later be distributed by vault_id (Citus) without changing keys.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0001_initial"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


UPGRADE = [
    # One row per vault. seq = the per-vault commit-ordered sequence (PROTOCOL §9),
    # bumped under this row's lock by every push; compacted_through = highest seq
    # of a tombstone physically removed by compaction (§12); bytes_used = sum of the
    # stored blobs' size_bytes, kept by pushes and compaction for the quota (§6).
    """
    CREATE TABLE vaults (
        vault_id          text        PRIMARY KEY,
        seq               bigint      NOT NULL DEFAULT 0 CHECK (seq >= 0),
        created_at        timestamptz NOT NULL DEFAULT now(),
        compacted_through bigint      NOT NULL DEFAULT 0
                          CHECK (compacted_through >= 0 AND compacted_through <= seq),
        bytes_used        bigint      NOT NULL DEFAULT 0 CHECK (bytes_used >= 0)
    )
    """,
    # The newest accepted version (or tombstone) of each memory, stored verbatim
    # (the 8 envelope fields, §3) plus the server's sequence and receive time.
    # created_at is the pushed text (inside the HMAC); created_at_ts its instant,
    # for legacy pulls (§7).
    """
    CREATE TABLE blobs (
        vault_id      text        NOT NULL REFERENCES vaults (vault_id) ON DELETE CASCADE,
        memory_id     text        NOT NULL,
        device_id     text        NOT NULL,
        vector_clock  bigint      NOT NULL CHECK (vector_clock >= 0),
        ciphertext    text        NOT NULL,
        hmac          text        NOT NULL,
        created_at    text        NOT NULL,
        created_at_ts timestamptz NOT NULL,
        deleted       boolean     NOT NULL,
        seq           bigint      NOT NULL CHECK (seq > 0),
        received_at   timestamptz NOT NULL DEFAULT now(),
        size_bytes    integer     NOT NULL CHECK (size_bytes >= 0),
        PRIMARY KEY (vault_id, memory_id)
    )
    """,
    # Cursor pulls (§9): seq > N ordered by seq; unique per vault.
    "CREATE UNIQUE INDEX blobs_vault_id_seq_key ON blobs (vault_id, seq)",
    # Legacy pulls (§7): created_at >= since ordered by (created_at, seq).
    "CREATE INDEX blobs_vault_id_created_at_ts_seq_idx ON blobs (vault_id, created_at_ts, seq)",
    # Compaction (§12) scans only tombstones.
    "CREATE INDEX blobs_tombstones_idx ON blobs (vault_id, seq) WHERE deleted",
    # The roster (§5) and per-device pull progress for compaction (§12).
    """
    CREATE TABLE devices (
        vault_id      text        NOT NULL,
        device_id     text        NOT NULL,
        label         text,
        first_seen    timestamptz NOT NULL DEFAULT now(),
        last_seen     timestamptz NOT NULL DEFAULT now(),
        blob_count    bigint      NOT NULL DEFAULT 0 CHECK (blob_count >= 0),
        revoked_at    timestamptz,
        pulled_cursor bigint      NOT NULL DEFAULT 0 CHECK (pulled_cursor >= 0),
        pulled_at     timestamptz,
        PRIMARY KEY (vault_id, device_id)
    )
    """,
    # Minted keys (§5, §10): only the SHA-256 of the key is stored. vault_id NULL
    # means every vault (minted keys always have one); device_id binds a key to
    # one device, which needs a vault.
    """
    CREATE TABLE api_keys (
        id           text        PRIMARY KEY,
        key_hash     bytea       NOT NULL UNIQUE CHECK (octet_length(key_hash) = 32),
        prefix       text        NOT NULL,
        vault_id     text,
        is_admin     boolean     NOT NULL DEFAULT false,
        device_id    text,
        rate_per_sec integer     NOT NULL DEFAULT 100 CHECK (rate_per_sec > 0),
        label        text,
        created_at   timestamptz NOT NULL DEFAULT now(),
        revoked_at   timestamptz,
        CONSTRAINT api_keys_device_needs_vault CHECK (device_id IS NULL OR vault_id IS NOT NULL)
    )
    """,
    "CREATE INDEX api_keys_vault_id_idx ON api_keys (vault_id)",
    # Per-vault quota overrides; NULL = the relay's default.
    """
    CREATE TABLE quotas (
        vault_id    text    PRIMARY KEY,
        max_devices integer CHECK (max_devices >= 0),
        max_bytes   bigint  CHECK (max_bytes >= 0)
    )
    """,
]

DOWNGRADE = [
    "DROP TABLE quotas",
    "DROP TABLE api_keys",
    "DROP TABLE devices",
    "DROP TABLE blobs",
    "DROP TABLE vaults",
]


def upgrade() -> None:
    """Create the initial schema."""
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    """Drop the initial schema."""
    for statement in DOWNGRADE:
        op.execute(statement)
