"""The anti-entropy digest (PROTOCOL §18, docs/digest.md).

- `engram_digest_bucket(memory_id)`: the first byte of SHA-256(memory_id), 0..255. Marked
  IMMUTABLE (convert_to is only STABLE because of encoding lookups; the conversion to
  UTF-8 of a given text never changes for a database), so it can feed a generated column.
- `blobs.digest_bucket`: that byte, a STORED generated column, so no writer changes and
  every existing row gets it when this revision rewrites the table; with the index
  `(vault_id, digest_bucket, memory_id)` a bucket of a large vault is an index range, not
  a scan of the vault.
- `vaults.digest`: the XOR of SHA-256(memory_id ‖ 0x00 ‖ device_id ‖ 0x00 ‖
  u64_LE(vector_clock) ‖ deleted byte) over every blob row of the vault (the current
  version of each memory, live or tombstone), 32 bytes. Pushes (relay.store.push) and
  compaction (relay.store.compaction) keep it under the vault row lock they already
  take. The count of §18 is `live_blobs + tombstones` (revision 0003).

Backfill: every vault's digest from its rows, in SQL (u64_LE built from the hex of the
clock, the XOR as `bit_xor` over the four 8-byte words of each hash). The relay checks
the same value in Python in tests (tests/relay/http/test_digest.py).

Revision ID: 0008_digest
Revises: 0007_idempotency
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008_digest"
down_revision: str | Sequence[str] | None = "0007_idempotency"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LE_CLOCK = (
    "decode(substr(h, 15, 2) || substr(h, 13, 2) || substr(h, 11, 2) || substr(h, 9, 2)"
    " || substr(h, 7, 2) || substr(h, 5, 2) || substr(h, 3, 2) || substr(h, 1, 2), 'hex')"
)


def word(n: int, column: str = "v") -> str:
    """bit_xor over the n-th 8-byte word (0..3) of a 32-byte hash column: PostgreSQL has
    no XOR aggregate over bytea, so four bigint ones, joined again with int8send."""
    return f"bit_xor(('x' || encode(substr({column}, {8 * n + 1}, 8), 'hex'))::bit(64)::bigint)"


UPGRADE = [
    """
    CREATE FUNCTION engram_digest_bucket(memory_id text) RETURNS smallint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT get_byte(sha256(convert_to(memory_id, 'UTF8')), 0)::smallint $$
    """,
    # PROTOCOL §18: one version's hash, for the backfill below and the bucket answers
    # (relay.store.digest); relay.store.push computes the same in Python.
    f"""
    CREATE FUNCTION engram_version_hash(memory_id text, device_id text, vector_clock bigint,
                                        deleted boolean) RETURNS bytea
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT sha256(convert_to(memory_id, 'UTF8') || '\\x00'::bytea
                        || convert_to(device_id, 'UTF8') || '\\x00'::bytea
                        || {_LE_CLOCK.replace("h,", "lpad(to_hex(vector_clock), 16, '0'),")}
                        || CASE WHEN deleted THEN '\\x01'::bytea ELSE '\\x00'::bytea END) $$
    """,
    "ALTER TABLE blobs ADD COLUMN digest_bucket smallint"
    " GENERATED ALWAYS AS (engram_digest_bucket(memory_id)) STORED",
    "CREATE INDEX blobs_digest_bucket_idx ON blobs (vault_id, digest_bucket, memory_id)",
    "ALTER TABLE vaults ADD COLUMN digest bytea NOT NULL"
    " DEFAULT decode(repeat('00', 32), 'hex') CHECK (length(digest) = 32)",
    f"""
    WITH versions AS (
        SELECT vault_id, engram_version_hash(memory_id, device_id, vector_clock, deleted) AS v
        FROM blobs
    ), words AS (
        SELECT vault_id, {word(0)} AS a, {word(1)} AS b, {word(2)} AS c, {word(3)} AS d
        FROM versions GROUP BY vault_id
    )
    UPDATE vaults SET digest = int8send(w.a) || int8send(w.b) || int8send(w.c) || int8send(w.d)
    FROM words w WHERE vaults.vault_id = w.vault_id
    """,  # noqa: S608 - constants only
]

DOWNGRADE = [
    "ALTER TABLE vaults DROP COLUMN digest",
    "DROP INDEX blobs_digest_bucket_idx",
    "ALTER TABLE blobs DROP COLUMN digest_bucket",
    "DROP FUNCTION engram_digest_bucket(text)",
    "DROP FUNCTION engram_version_hash(text, text, bigint, boolean)",
]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
