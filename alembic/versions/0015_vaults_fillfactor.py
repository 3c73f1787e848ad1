"""`vaults` with fillfactor 50, so that a push's update of its vault row stays on the row's
page (a HOT update: no new index entries, no new page) (PROTOCOL §18, docs/digest.md).

Since revision 0012 a vault row holds its bucket prefixes and counts (2,048 + 1,024
bytes), so a page holds two versions of it. At the default fillfactor (100) PostgreSQL
prunes a page's dead versions only when less than a tenth of it is free, which never
happens before the next update finds too little room: every second push wrote the row to
a new page and both of the table's indexes, and one vault grew its table by about 4 KB a
push until vacuum (12 MB after 3,000 pushes). At fillfactor 50 a page is pruned as soon as
less than half of it is free, before the room for the next version runs out: the 3,000
pushes leave the table one page (tests/relay/db/test_db_migrations.py).

A storage parameter only: no rewrite, no lock beyond a moment's; pages already written
are pruned on their next update.

Revision ID: 0015_vaults_fillfactor
Revises: 0014_bucket_out_of_blobs
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0015_vaults_fillfactor"
down_revision: str | Sequence[str] | None = "0014_bucket_out_of_blobs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = ["ALTER TABLE vaults SET (fillfactor = 50)"]

DOWNGRADE = ["ALTER TABLE vaults RESET (fillfactor)"]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
