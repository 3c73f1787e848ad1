"""The owner's undo of a retire against the erasure of the maintenance round (PROTOCOL
§19; docs/rekey.md "Undoing a retire"; issue 31 finding 4).

The erasure lists the vaults past `erase_after` outside their row lock, then erases each
under it. An undo that began before `erase_after` and commits while the erasure waits
for the lock must keep every blob: the erasure re-checks the retirement under the lock.
The interleaving is driven step by step: the test plays the undo on its own connection,
holding the row lock, until the erasure waits for it.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.store import retire as retire_store
from tests.relay.conftest import Relay
from tests.relay.support import (
    Sealer,
    client,
    module_relay_fixture,
    new_vault_id,
    push_ok,
    run_db,
    wait_for_lock_waiters,
)

relay = module_relay_fixture()


@pytest.mark.parametrize("undone", [True, False])
def test_an_undo_committing_while_the_erasure_waits_keeps_every_blob(
    relay: Relay, undone: bool
) -> None:
    vault = new_vault_id("undo-race")
    with client(relay) as http:
        push_ok(http, vault, Sealer(vault).blobs(3))

    async def retire_expired(conn: asyncpg.Connection) -> None:
        await retire_store.retire_on(conn, vault, None, timedelta(days=30))
        await conn.execute("UPDATE vaults SET erase_after = retired_at WHERE vault_id = $1", vault)

    run_db(relay.database_url, retire_expired)
    name = f"undo-race-{vault}"[:60]

    async def race() -> None:
        url = to_libpq_url(relay.database_url)
        gate = await asyncpg.connect(url)
        eraser = await asyncpg.connect(url, server_settings={"application_name": name})
        try:
            async with gate.transaction():  # the undo, holding the row lock
                await gate.execute("SELECT 1 FROM vaults WHERE vault_id = $1 FOR UPDATE", vault)
                if undone:
                    await gate.execute(
                        "UPDATE vaults SET retired_at = NULL, successor = NULL,"
                        " erase_after = NULL WHERE vault_id = $1",
                        vault,
                    )
                erasing = asyncio.ensure_future(retire_store.erase_expired(eraser))
                await wait_for_lock_waiters(gate, name, 1)
            await erasing
        finally:
            await gate.close()
            await eraser.close()

    asyncio.run(race())
    (row,) = relay.sql("SELECT count(*) AS n FROM blobs WHERE vault_id = $1", vault)
    # Undone: every blob stays. Next to it, the same interleaving without the undo erases.
    assert row["n"] == (3 if undone else 0)
