"""The bucket prefixes and counts of a vault computed from its rows, for the tests of the
stored ones (PROTOCOL §18, revision 0012): test_bucket_prefixes.py, test_push_groups.py,
the crash and convergence suites."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from engram_sync.relay.store.bucket_prefixes import count_list
from engram_sync.relay.store.digest import bucket_digests
from engram_sync.shared_format.digest import Version, bucket_of, bucket_prefixes, version_hash


def _version(memory_id: str, device_id: str, clock: int, deleted: bool) -> int:
    return int.from_bytes(
        hashlib.sha256(
            memory_id.encode() + b"\x00" + device_id.encode() + b"\x00"
            + clock.to_bytes(8, "little") + (b"\x01" if deleted else b"\x00")
        ).digest(),
        "big",
    )  # fmt: skip


async def oracle(conn: Any, vault_id: str) -> tuple[bytes, list[int]]:
    """The 256 prefixes and counts computed now from the vault's rows, each in the bucket
    of its memory id (PROTOCOL §18); checked against the relay's grouped SQL."""
    rows = await conn.fetch(
        "SELECT memory_id, device_id, vector_clock, deleted FROM blobs WHERE vault_id = $1",
        vault_id,
    )
    xors = [0] * 256
    counts = [0] * 256
    for r in rows:
        bucket = hashlib.sha256(r["memory_id"].encode()).digest()[0]
        xors[bucket] ^= _version(r["memory_id"], r["device_id"], r["vector_clock"], r["deleted"])
        counts[bucket] += 1
    _, found = await bucket_digests(conn, vault_id, None)
    assert {b: (d.count, d.digest) for b, d in found.items()} == {
        b: (counts[b], xors[b]) for b in range(256) if counts[b]
    }
    return b"".join(x.to_bytes(32, "big")[:8] for x in xors), counts


async def stored(conn: Any, vault_id: str) -> tuple[bytes, list[int]]:
    row = await conn.fetchrow(
        "SELECT bucket_prefixes, bucket_counts FROM vaults WHERE vault_id = $1", vault_id
    )
    return row["bucket_prefixes"], count_list(row["bucket_counts"])


def versions_buckets(versions: Iterable[Version]) -> tuple[bytes, list[int]]:
    """The 256 prefixes and counts of a set of versions (a device's held versions, or the
    relay's rows), computed with `shared_format.digest`: what `?buckets=1` must answer."""
    digests: dict[int, int] = {}
    counts = [0] * 256
    for v in versions:
        bucket = bucket_of(v.memory_id)
        digests[bucket] = digests.get(bucket, 0) ^ version_hash(*v)
        counts[bucket] += 1
    return bucket_prefixes(digests), counts
