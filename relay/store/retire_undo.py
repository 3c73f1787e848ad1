"""Undoing a vault's retirement within its grace period (PROTOCOL §19, §13; docs/rekey.md
"Undoing a retire").

`undo_retire` clears the retirement under the vault's row lock, the lock pushes and the
erase of the maintenance round take (relay.store.retire): a push waiting for it after the
undo commits finds the vault live again. Only while `erase_after` is in the future: once
it has passed, the blobs are erased or about to be, and the vault answers 410
`vault_retired` like every route of an erased vault. The erase re-checks the retirement
under the same lock, so an undo committing while the erase waits keeps the blobs.
"""

from __future__ import annotations

import asyncpg

from engram_sync.relay.domain.domain_errors import VaultRetiredError

_LOCK = (
    "SELECT retired_at IS NOT NULL AS retired, erase_after <= now() AS erased, successor"
    " FROM vaults WHERE vault_id = $1 FOR UPDATE"
)
# The successor statement (revision 0016) belongs to the retirement: it goes with it.
_UNDO = (
    "UPDATE vaults SET retired_at = NULL, successor = NULL, erase_after = NULL,"
    " successor_statement = NULL, successor_stated_at = NULL WHERE vault_id = $1"
)


async def undo_retire(pool: asyncpg.Pool, vault_id: str) -> bool:
    """Bring a retired vault back (pushes accepted again); False when it was not retired
    (idempotent). `VaultRetiredError` once its grace period is over."""
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(_LOCK, vault_id)
        if row is None or not row["retired"]:
            return False
        if row["erased"]:
            raise VaultRetiredError(vault_id, row["successor"])
        await conn.execute(_UNDO, vault_id)
    return True
