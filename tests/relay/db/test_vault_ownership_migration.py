"""0006_vault_ownership on a relay that already holds keys, wraps and data: the backfill.

The rules are in the migration's docstring; each vault here is one case of them,
including the squatting case of issue 14 (an account first, then the operator's
team: the operator's, and the account gets no grant).
"""

from __future__ import annotations

import asyncio

import asyncpg
from alembic import command

from engram_sync.relay.db.migrate import alembic_config, upgrade_to_head

PHC = "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"


async def _fill(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for n in (1, 2, 3):
            await conn.execute(
                "INSERT INTO accounts (id, email, password_hash, created_at)"
                " VALUES ($1, $2, $3, '2026-01-01')",
                f"acct_{n}",
                f"a{n}@example.org",
                PHC,
            )

        async def key(vault: str, account: str | None, at: str) -> None:
            n = await conn.fetchval("SELECT count(*) FROM api_keys")
            await conn.execute(
                "INSERT INTO api_keys (id, key_hash, prefix, vault_id, account_id, created_at)"
                " VALUES ($1, $2, 'en_xxxxx', $3, $4, $5::text::timestamptz)",
                f"k_{n:012d}",
                bytes([n]) * 32,
                vault,
                account,
                at,
            )

        async def wrap(vault: str, account: str, at: str) -> None:
            await conn.execute(
                "INSERT INTO vault_wraps (account_id, vault_id, wrapped_k, updated_at)"
                " VALUES ($1, $2, 'AAAA', $3::text::timestamptz)",
                account,
                vault,
                at,
            )

        async def vault(vault_id: str, at: str) -> None:
            await conn.execute(
                "INSERT INTO vaults (vault_id, created_at) VALUES ($1, $2::text::timestamptz)",
                vault_id,
                at,
            )

        # The squat: acct_1 wrapped it first, then the operator minted keys and pushed.
        await wrap("squatted", "acct_1", "2026-02-01")
        await key("squatted", None, "2026-02-02")
        await vault("squatted", "2026-02-03")
        # One account's own vault, with its data.
        await wrap("own", "acct_2", "2026-02-01")
        await key("own", "acct_2", "2026-02-01")
        await vault("own", "2026-02-02")
        # Two accounts: the first owns it, the one that adopted later is granted.
        await key("shared", "acct_1", "2026-02-01")
        await wrap("shared", "acct_3", "2026-02-05")
        # Data from static or global keys only, and later an account's wrap (adopted).
        await vault("static", "2026-01-10")
        await wrap("static", "acct_3", "2026-02-01")
        # Nothing but a pre-revoked device, and nothing but operator keys.
        await conn.execute("INSERT INTO devices (vault_id, device_id) VALUES ('roster', 'd1')")
        await key("keys-only", None, "2026-02-01")
    finally:
        await conn.close()


async def _read(url: str) -> tuple[dict[str, tuple[str, str | None]], set[tuple[str, str]]]:
    conn = await asyncpg.connect(url)
    try:
        owners = {
            r["vault_id"]: (r["owner"], r["account_id"])
            for r in await conn.fetch("SELECT vault_id, owner, account_id FROM vault_owners")
        }
        grants = {
            (r["vault_id"], r["account_id"])
            for r in await conn.fetch("SELECT vault_id, account_id FROM vault_grants")
        }
        return owners, grants
    finally:
        await conn.close()


def test_backfill_gives_each_vault_its_first_user(empty_database_url: str) -> None:
    url = empty_database_url
    command.upgrade(alembic_config(url), "0005_handoff_pake")
    asyncio.run(_fill(url))
    upgrade_to_head(url)
    owners, grants = asyncio.run(_read(url))
    assert owners == {
        "squatted": ("operator", None),
        "own": ("account", "acct_2"),
        "shared": ("account", "acct_1"),
        "static": ("operator", None),
        "roster": ("operator", None),
        "keys-only": ("operator", None),
    }
    assert grants == {("shared", "acct_3")}


def test_downgrade_drops_the_tables(fresh_database_url: str) -> None:
    url = fresh_database_url
    command.downgrade(alembic_config(url), "0005_handoff_pake")

    async def tables() -> set[str]:
        conn = await asyncpg.connect(url)
        try:
            rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            return {r["tablename"] for r in rows}
        finally:
            await conn.close()

    assert not {"vault_owners", "vault_grants"} & asyncio.run(tables())
    upgrade_to_head(url)
    assert {"vault_owners", "vault_grants"} <= asyncio.run(tables())
