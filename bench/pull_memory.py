"""Relay RSS while several devices pull a vault of 1 MiB blobs at once, every page.

The vault is written straight into the relay's tables with the relay's own upsert
(like the ceiling), so the relay's heap holds nothing from the seeding; then
`CONCURRENT_PULLS` devices page through the whole vault at the same time with the
cursor, while the monitor samples the relay's RSS (its workers included). Each page
stops at the relay's page byte cap (ENGRAM_RELAY_MAX_PAGE_BYTES, default 8 MiB), so
a full pull is many pages; what a page costs the relay is what this measures.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

import asyncpg
import httpx

from bench import ceiling
from bench.relay_load import BenchError, headers, pull_page
from bench.settings import PULL_PAGE
from engram_sync.relay.services.config import DEFAULT_MAX_PAGE_BYTES
from engram_sync.relay.store.push import BLOB_UPSERT
from engram_sync.shared_format import BlobCipher, SyncKeys
from engram_sync.shared_format.blob import NONCE_LEN, TAG_LEN

BLOB_CHARS: Final = 1_048_576  # base64 characters: the largest blob a default relay takes
CONCURRENT_PULLS: Final = 4
SEED_BATCH: Final = 8  # blobs per upsert while seeding (about 8 MiB per statement)
MB: Final = 1024 * 1024


@dataclass(frozen=True)
class FullPull:
    """One device's pull of the whole vault."""

    blobs: int
    pages: int
    seconds: float


async def seed(conn: asyncpg.Connection, vault_id: str, count: int) -> int:
    """Write `count` sealed blobs of exactly BLOB_CHARS base64 characters into a new vault
    (real AES-256-GCM ciphertexts and HMACs); returns their ciphertext characters."""
    cipher = BlobCipher(SyncKeys(enc_key=os.urandom(32), hmac_key=os.urandom(32)))
    plaintext_bytes = BLOB_CHARS // 4 * 3 - NONCE_LEN - TAG_LEN
    device_id = str(uuid.uuid4())
    await conn.execute("INSERT INTO vaults (vault_id) VALUES ($1)", vault_id)
    total = 0
    for first in range(0, count, SEED_BATCH):
        blobs = [
            cipher.seal(
                secrets.token_hex(plaintext_bytes // 2),
                vault_id=vault_id,
                memory_id=f"big-{i:05d}",
                device_id=device_id,
                vector_clock=1,
                deleted=False,
            )
            for i in range(first, min(first + SEED_BATCH, count))
        ]
        assert all(len(b.ciphertext) == BLOB_CHARS for b in blobs)
        await conn.execute(BLOB_UPSERT, *ceiling.columns(blobs, first + 1))
        total += sum(len(b.ciphertext) for b in blobs)
    await conn.execute(
        "UPDATE vaults SET seq = $2, bytes_used = $3 WHERE vault_id = $1", vault_id, count, total
    )
    await conn.execute("ANALYZE blobs")
    return total


def full_pull(base_url: str, key: str, vault_id: str, expected: int) -> FullPull:
    """Page through the whole vault with the cursor as a new device does."""
    started = time.perf_counter()
    blobs = pages = cursor = 0
    with httpx.Client(
        base_url=base_url, headers=headers(key, str(uuid.uuid4())), timeout=300.0
    ) as client:
        while True:
            answer = pull_page(client, vault_id, cursor, PULL_PAGE)
            pages += 1
            blobs += len(answer.blobs)
            cursor = answer.cursor if isinstance(answer.cursor, int) else cursor
            if not answer.has_more or not answer.blobs:
                break
    if blobs != expected:
        raise BenchError(f"a full pull returned {blobs} blobs, expected {expected}")
    return FullPull(blobs, pages, time.perf_counter() - started)


def concurrent_full_pulls(
    base_url: str, key: str, vault_id: str, expected: int, pulls: int = CONCURRENT_PULLS
) -> list[FullPull]:
    """`pulls` devices pull the whole vault at the same time (a thread and a connection
    each); every one must get every blob."""
    with ThreadPoolExecutor(max_workers=pulls) as pool:
        futures = [pool.submit(full_pull, base_url, key, vault_id, expected) for _ in range(pulls)]
        return [f.result() for f in futures]


def max_page_bytes() -> int:
    """The relay's page byte cap: the relay process inherits this environment."""
    raw = os.environ.get("ENGRAM_RELAY_MAX_PAGE_BYTES", "").strip()
    return int(raw) if raw else DEFAULT_MAX_PAGE_BYTES


def summarise(
    blobs: int, chars: int, pulls: list[FullPull], rss_before_mb: float, rss_peak_mb: float
) -> dict[str, Any]:
    """The section of the report."""
    return {
        "blobs": blobs,
        "blob_base64_chars": BLOB_CHARS,
        "vault_base64_mib": chars / MB,
        "concurrent_pulls": len(pulls),
        "max_page_bytes": max_page_bytes(),
        "pages_per_pull": max(p.pages for p in pulls),
        "pull_seconds_max": max(p.seconds for p in pulls),
        "blobs_per_pull": min(p.blobs for p in pulls),
        "rss_before_mb": rss_before_mb,
        "rss_peak_mb": rss_peak_mb,
        "rss_growth_mb": rss_peak_mb - rss_before_mb,
    }


def measure(
    loop: asyncio.Runner,
    conn: asyncpg.Connection,
    monitor: Any,
    base_url: str,
    key: str,
    blobs: int,
    vault_id: str = "pull-memory",
) -> dict[str, Any]:
    """Seed the vault, then the concurrent full pulls under the monitor's phase
    `pull_memory` (whose peak RSS is the figure)."""
    chars = loop.run(seed(conn, vault_id, blobs))
    with monitor.phase("pull_memory"):
        before = monitor.rss_mb()
        pulls = concurrent_full_pulls(base_url, key, vault_id, blobs)
    peak = monitor.phases["pull_memory"].relay_rss_peak_mb
    return summarise(blobs, chars, pulls, before, max(peak, before))
