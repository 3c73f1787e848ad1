"""Vault ownership and grants (PROTOCOL §13 "Vault ownership", docs/vault-ownership.md).

`vault_owners`: one row per vault id that anyone has used, made by its first use
(INSERT ... ON CONFLICT DO NOTHING, in the transaction of the key or wrap write) and
never changed by the relay afterwards. `owner` is 'operator' (a static key, a key
minted with `engram-relay keys create`, a first push) or 'account' with `account_id`.
`vault_grants`: accounts an admin of the vault let in; an account may mint keys and
store wraps for a vault it owns or was granted.

Backfill of an existing database, for every vault id found in vaults, api_keys,
vault_wraps, devices or pairing_codes:

1. operator, when an operator-minted key (api_keys.account_id IS NULL, revoked or not)
   was ever made for it, or when no account has a key or a wrap for it (its data came
   from static or global operator keys), or when its first push (vaults.created_at)
   predates every account's first key or wrap for it;
2. otherwise the account with the earliest stake (its first key's created_at, or its
   wrap's updated_at), ties by account id; every other account with a key or wrap
   there gets a grant (before this revision a second account could only get in by
   adopting with an admin key of the vault, i.e. an admin let it in).

Accounts that hold a wrap for a vault that becomes operator-owned get no grant: that
is the squatting case of issue 14 (an account that claimed an id the operator's team
then used). An account that adopted such a vault with an admin key gets back in by
storing its wrap again with `X-Engram-Vault-Key` (`engram-sync vault open` does), or
by a grant (`engram-relay vaults grant VAULT EMAIL`). Keys already minted keep working
either way: revoke them with `engram-relay keys revoke` (see `engram-relay vaults show`).

Revision ID: 0006_vault_ownership
Revises: 0005_handoff_pake
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0006_vault_ownership"
down_revision: str | Sequence[str] | None = "0005_handoff_pake"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = [
    """
    CREATE TABLE vault_owners (
        vault_id   text        PRIMARY KEY,
        owner      text        NOT NULL CHECK (owner IN ('operator', 'account')),
        account_id text        REFERENCES accounts (id),
        claimed_at timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT vault_owners_account_pair CHECK ((owner = 'account') = (account_id IS NOT NULL))
    )
    """,
    "CREATE INDEX vault_owners_account_id_idx ON vault_owners (account_id)"
    " WHERE account_id IS NOT NULL",
    # granted_by: "key:<key id>" (an admin key of the vault), "static:<n>" or "cli".
    """
    CREATE TABLE vault_grants (
        vault_id   text        NOT NULL,
        account_id text        NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
        granted_by text        NOT NULL,
        granted_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (vault_id, account_id)
    )
    """,
    "CREATE INDEX vault_grants_account_id_idx ON vault_grants (account_id, vault_id)",
    # The backfill (rules in the module docstring).
    """
    CREATE TEMPORARY TABLE backfill_stakes AS
    SELECT vault_id, account_id, min(at) AS first_at FROM (
        SELECT vault_id, account_id, created_at AS at FROM api_keys
        WHERE vault_id IS NOT NULL AND account_id IS NOT NULL
        UNION ALL
        SELECT vault_id, account_id, updated_at FROM vault_wraps
    ) s GROUP BY vault_id, account_id
    """,
    """
    INSERT INTO vault_owners (vault_id, owner, account_id, claimed_at)
    SELECT ids.vault_id,
           CASE WHEN won.vault_id IS NULL THEN 'operator' ELSE 'account' END,
           won.account_id,
           coalesce(least(first.first_at, v.created_at, op.first_at), now())
    FROM (
        SELECT vault_id FROM vaults
        UNION SELECT vault_id FROM api_keys WHERE vault_id IS NOT NULL
        UNION SELECT vault_id FROM vault_wraps
        UNION SELECT vault_id FROM devices
        UNION SELECT vault_id FROM pairing_codes
    ) ids
    LEFT JOIN vaults v ON v.vault_id = ids.vault_id
    LEFT JOIN (SELECT vault_id, min(created_at) AS first_at FROM api_keys
               WHERE vault_id IS NOT NULL AND account_id IS NULL GROUP BY vault_id) op
           ON op.vault_id = ids.vault_id
    LEFT JOIN LATERAL (
        SELECT s.vault_id, s.account_id, s.first_at FROM backfill_stakes s
        WHERE s.vault_id = ids.vault_id ORDER BY s.first_at, s.account_id LIMIT 1
    ) first ON true
    LEFT JOIN LATERAL (
        SELECT first.vault_id, first.account_id
        WHERE op.vault_id IS NULL AND (v.created_at IS NULL OR first.first_at <= v.created_at)
    ) won ON first.vault_id IS NOT NULL
    """,
    """
    INSERT INTO vault_grants (vault_id, account_id, granted_by, granted_at)
    SELECT s.vault_id, s.account_id, 'migration', s.first_at
    FROM backfill_stakes s
    JOIN vault_owners o ON o.vault_id = s.vault_id
    WHERE o.owner = 'account' AND o.account_id <> s.account_id
    """,
    "DROP TABLE backfill_stakes",
]

DOWNGRADE = [
    "DROP TABLE vault_grants",
    "DROP TABLE vault_owners",
]


def upgrade() -> None:
    """Create the two tables and fill them from the keys, wraps and data already stored."""
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    """Drop them again (back to 0005_handoff_pake)."""
    for statement in DOWNGRADE:
        op.execute(statement)
