"""The relay generation (PROTOCOL §17): a random id of this database's history.

Made by migration 0004_generation and replaced by `engram-relay restore`, so a device
that sees it change knows the relay may have forgotten what it pushed. Relay processes
read it at startup (`read_generation`) and in the periodic health refresh's query
(relay.serving.app), never per request.
"""

from __future__ import annotations

import secrets

import asyncpg

__all__ = ["new_generation", "read_generation"]


async def read_generation(conn: asyncpg.Connection) -> str:
    """The database's generation; an error when the schema lacks it (not migrated)."""
    try:
        generation: str | None = await conn.fetchval("SELECT generation FROM relay_meta")
    except asyncpg.UndefinedTableError:
        generation = None
    if generation is None:
        raise RuntimeError("relay_meta has no generation row: run `engram-relay migrate`")
    return generation


async def new_generation(conn: asyncpg.Connection) -> str:
    """Replace the generation with a fresh random one (16 bytes, hex) and return it.

    Written for a database that holds the row (0004_generation or later); a database
    from before that revision gets its first generation when it is next migrated.
    """
    generation = secrets.token_hex(16)
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO relay_meta (generation) VALUES ($1) ON CONFLICT (singleton)"
            " DO UPDATE SET generation = EXCLUDED.generation, changed_at = EXCLUDED.changed_at",
            generation,  # EXCLUDED: Citus refuses now() in DO UPDATE SET (SCALING.md §3)
        )
    return generation
