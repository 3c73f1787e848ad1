"""The anti-entropy digest on PostgreSQL (PROTOCOL §18, docs/digest.md).

The vault's digest is stored (`vaults.digest`, kept by pushes and compaction under the
vault row lock), and so are the 256 bucket prefixes and counts of `?buckets=1`
(`vaults.bucket_prefixes`, `vaults.bucket_counts`, revision 0012: one row read); one
bucket's digest, list and narrowing are computed on request over the vault's rows, each
row's bucket by `bucket_of_sql` (revision 0014 took the bucket out of `blobs`: it cost
every push more than figure 12 allows, docs/digest.md "Costs and figures"), with the
version hash of revision 0008_digest in SQL. Each answer is one statement, hence one
snapshot: the cursor, the count and the digest describe the same commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import asyncpg

from engram_sync.relay.store.bucket_prefixes import ZERO_PREFIXES, count_list
from engram_sync.shared_format.digest import (
    BUCKETS,
    EMPTY_DIGEST,
    PREFIX_BYTES,
    SUB_BUCKETS,
    Version,
    bucket_prefixes,
    digest_int,
)
from engram_sync.shared_format.wire import SyncBlob

# The XOR of the version hashes `v` of a set of rows as four 8-byte words `w0`..`w3`:
# PostgreSQL has no XOR aggregate over bytea (the expression of revision 0008_digest);
# `xor_of_words` turns a row's words back into the 256-bit value. Compaction uses both.
XOR_WORDS = ", ".join(
    f"coalesce(bit_xor(('x' || encode(substr(v, {8 * n + 1}, 8), 'hex'))::bit(64)::bigint), 0)"
    f" AS w{n}"
    for n in range(4)
)


def bucket_of_sql(memory_id: str) -> str:
    """PROTOCOL §18: the bucket of the memory id `memory_id` (an SQL expression), as
    `shared_format.digest.bucket_of` computes it: the body of `engram_digest_bucket`
    (revision 0008) written out, since a call of that function is not inlined and costs
    3 us a row against 1 us for the expression."""
    return f"get_byte(sha256(convert_to({memory_id}, 'UTF8')), 0)"


_VAULT = "SELECT seq, live_blobs + tombstones AS n, digest FROM vaults WHERE vault_id = $1"
# PROTOCOL §18, ours: every bucket's prefix and count, stored (revision 0012)
_BUCKET_PREFIXES = (
    "SELECT seq, digest, bucket_prefixes, bucket_counts FROM vaults WHERE vault_id = $1"
)

# $2 = one bucket, or NULL for every bucket of the vault (grouped: a pass over all the
# vault's rows, no longer asked by a route, kept as the tests' oracle of the stored
# prefixes and counts: tests/relay/store/test_bucket_prefixes.py). The LATERAL filters on
# `b.vault_id = $1` too: Citus plans it as one task on the vault's shard only then (with
# `= v.vault_id` alone it ran on every shard: deploy/SCALING.md §3).
_BUCKETS = f"""
SELECT v.seq, h.digest_bucket, h.n, h.w0, h.w1, h.w2, h.w3
FROM vaults v LEFT JOIN LATERAL (
    SELECT digest_bucket, count(*) AS n, {XOR_WORDS}
    FROM (SELECT {bucket_of_sql("b.memory_id")} AS digest_bucket,
                 engram_version_hash(memory_id, device_id, vector_clock, deleted) AS v
          FROM blobs b WHERE b.vault_id = v.vault_id AND b.vault_id = $1) x
    WHERE $2::smallint IS NULL OR digest_bucket = $2
    GROUP BY digest_bucket
) h ON true
WHERE v.vault_id = $1
"""  # noqa: S608 - constants only

_LIST = f"""
SELECT v.seq, b.memory_id, b.device_id, b.vector_clock, b.deleted
FROM vaults v LEFT JOIN LATERAL (
    SELECT memory_id, device_id, vector_clock, deleted FROM blobs b
    WHERE b.vault_id = v.vault_id AND b.vault_id = $1 AND b.memory_id > $3
        AND {bucket_of_sql("b.memory_id")} = $2
    ORDER BY b.memory_id LIMIT $4 + 1
) b ON true
WHERE v.vault_id = $1
"""  # noqa: S608 - constants only

# PROTOCOL §18, ours (docs/digest.md): one bucket narrowed by sub-bucket (the second byte
# of SHA-256(memory_id)) in one statement, so the bucket's count and digest, the
# sub-buckets that differ from the device's prefixes ($3: 256 x 8 bytes) and the versions
# listed describe one snapshot. The vault's rows are read, the bucket's kept (a pass over
# the vault: 0.3-0.7 s for 1,000,000 memories, bench.anti_entropy); the header row has a
# NULL memory_id.
_NARROW = f"""
WITH rows AS MATERIALIZED (
    SELECT b.memory_id, b.device_id, b.vector_clock, b.deleted,
           get_byte(sha256(convert_to(b.memory_id, 'UTF8')), 1) AS sub,
           engram_version_hash(b.memory_id, b.device_id, b.vector_clock, b.deleted) AS v
    FROM blobs b WHERE b.vault_id = $1 AND {bucket_of_sql("b.memory_id")} = $2
), sums AS (
    SELECT sub, {XOR_WORDS.split(", coalesce")[0]} FROM rows GROUP BY sub
), differ AS (
    SELECT s.sub FROM generate_series(0, 255) AS s(sub) LEFT JOIN sums USING (sub)
    WHERE int8send(coalesce(sums.w0, 0)) <> substr($3::bytea, 8 * s.sub + 1, 8)
), head AS (
    SELECT v.seq, (SELECT count(*) FROM rows) AS n, t.*,
           ARRAY(SELECT sub FROM differ ORDER BY sub) AS subs
    FROM vaults v CROSS JOIN (SELECT {XOR_WORDS} FROM rows) t WHERE v.vault_id = $1
)
SELECT h.*, NULL::text AS memory_id, NULL::text AS device_id, NULL::bigint AS vector_clock,
       NULL::boolean AS deleted
FROM head h
UNION ALL
(SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, r.memory_id, r.device_id, r.vector_clock,
        r.deleted
 FROM rows r WHERE r.sub IN (SELECT sub FROM differ) AND r.memory_id > $4
     AND EXISTS (SELECT 1 FROM head)
 ORDER BY r.memory_id LIMIT $5 + 1)
"""  # noqa: S608 - constants only

# By primary key (vault_id, memory_id)
_FETCH = """
SELECT vault_id, memory_id, device_id, vector_clock, ciphertext, hmac, created_at, deleted,
       size_bytes
FROM blobs WHERE vault_id = $1 AND memory_id = ANY($2::text[]) ORDER BY memory_id
"""


@dataclass(frozen=True)
class DigestState:
    """One digest answer: the vault's sequence with it, how many versions, their XOR."""

    cursor: int
    count: int
    digest: int


@dataclass(frozen=True)
class StoredBuckets:
    """`?buckets=1`: the vault's sequence and digest with its 256 stored bucket prefixes
    (8 bytes each, bucket order) and counts."""

    cursor: int
    digest: int
    prefixes: bytes
    counts: list[int]

    @property
    def count(self) -> int:
        """Versions over every bucket."""
        return sum(self.counts)


@dataclass(frozen=True)
class BucketList:
    """One page of a bucket's versions, ordered by memory_id."""

    cursor: int
    versions: list[Version]
    has_more: bool


@dataclass(frozen=True)
class Narrowed:
    """One narrow answer: the bucket's state, the sub-buckets that differ, their versions."""

    bucket: DigestState
    subs: list[int]
    versions: list[Version]
    has_more: bool


@dataclass(frozen=True)
class Fetched:
    """Current versions of the memories asked for, within a byte budget."""

    blobs: list[SyncBlob]
    has_more: bool
    missing: list[str] = field(default_factory=list)


class Reader(Protocol):
    """Where a scan's statement runs: an asyncpg pool or connection, or the relay's
    `scan_gate.BoundedReader` (its statement timeout)."""

    async def fetch(self, query: str, *args: object) -> list[asyncpg.Record]:
        """The rows of `query` with its arguments."""
        ...


def xor_of_words(row: asyncpg.Record) -> int:
    """The 256-bit XOR a row's `XOR_WORDS` columns hold."""
    raw = b"".join(int(row[f"w{n}"]).to_bytes(8, "big", signed=True) for n in range(4))
    return int.from_bytes(raw, "big")


async def vault_digest(pool: asyncpg.Pool, vault_id: str) -> DigestState:
    """The stored digest of the vault (0, 0, empty for a vault nobody pushed to)."""
    row = await pool.fetchrow(_VAULT, vault_id)
    if row is None:
        return DigestState(0, 0, digest_int(EMPTY_DIGEST))
    return DigestState(row["seq"], row["n"], digest_int(row["digest"]))


async def stored_buckets(pool: asyncpg.Pool, vault_id: str) -> StoredBuckets:
    """Every bucket's prefix and count as the vault row holds them: O(1), one row read
    (zeros for a vault nobody pushed to)."""
    row = await pool.fetchrow(_BUCKET_PREFIXES, vault_id)
    if row is None:
        return StoredBuckets(0, 0, ZERO_PREFIXES, [0] * BUCKETS)
    return StoredBuckets(
        int(row["seq"]),
        digest_int(row["digest"]),
        row["bucket_prefixes"],
        count_list(row["bucket_counts"]),
    )


async def bucket_digests(
    db: Reader, vault_id: str, bucket: int | None
) -> tuple[int, dict[int, DigestState]]:
    """(vault sequence, bucket -> its digest) for one bucket or for all (empty ones left
    out), computed now over the rows of the bucket(s)."""
    rows = await db.fetch(_BUCKETS, vault_id, bucket)
    if not rows:
        return 0, {}
    seq = int(rows[0]["seq"])
    found = {
        int(r["digest_bucket"]): DigestState(seq, int(r["n"]), xor_of_words(r))
        for r in rows
        if r["digest_bucket"] is not None
    }
    assert all(0 <= b < BUCKETS for b in found)
    return seq, found


def fold_buckets(found: dict[int, DigestState]) -> StoredBuckets:
    """The vault's digest, 256 bucket prefixes and counts from every bucket's digest
    (`bucket_digests(..., None)`): what the vault row stores, computed from the rows
    (`?deep=1`); `cursor` 0 (the caller has the sequence)."""
    digest = 0
    counts = [0] * BUCKETS
    for bucket, state in found.items():
        digest ^= state.digest
        counts[bucket] = state.count
    prefixes = bucket_prefixes({b: s.digest for b, s in found.items()})
    return StoredBuckets(0, digest, prefixes, counts)


async def bucket_list(db: Reader, vault_id: str, bucket: int, after: str, limit: int) -> BucketList:
    """At most `limit` versions of one bucket with memory_id > `after`."""
    rows = await db.fetch(_LIST, vault_id, bucket, after, limit)
    if not rows:
        return BucketList(0, [], False)
    versions = [
        Version(r["memory_id"], r["device_id"], r["vector_clock"], r["deleted"])
        for r in rows
        if r["memory_id"] is not None
    ]
    return BucketList(int(rows[0]["seq"]), versions[:limit], len(versions) > limit)


async def narrow(
    db: Reader, vault_id: str, bucket: int, prefixes: bytes, after: str, limit: int
) -> Narrowed:
    """The sub-buckets of `bucket` whose digests' first 8 bytes differ from `prefixes`
    (256 x 8 bytes), and at most `limit` of their versions with memory_id > `after`."""
    assert len(prefixes) == SUB_BUCKETS * PREFIX_BYTES
    rows = await db.fetch(_NARROW, vault_id, bucket, prefixes, after, limit)
    if not rows:  # no such vault: it holds nothing, so every non-zero prefix differs
        subs = [
            s
            for s in range(SUB_BUCKETS)
            if prefixes[s * PREFIX_BYTES : (s + 1) * PREFIX_BYTES] != bytes(PREFIX_BYTES)
        ]
        return Narrowed(DigestState(0, 0, 0), subs, [], False)
    head = next(r for r in rows if r["memory_id"] is None)
    state = DigestState(int(head["seq"]), int(head["n"]), xor_of_words(head))
    versions = sorted(
        Version(r["memory_id"], r["device_id"], r["vector_clock"], r["deleted"])
        for r in rows
        if r["memory_id"] is not None
    )
    return Narrowed(state, list(head["subs"]), versions[:limit], len(versions) > limit)


async def fetch_current(
    pool: asyncpg.Pool, vault_id: str, memory_ids: list[str], max_bytes: int
) -> Fetched:
    """The current blob of each memory asked for (ordered by memory_id), stopping before
    the ciphertext would pass `max_bytes` (at least one blob)."""
    rows = await pool.fetch(_FETCH, vault_id, sorted(set(memory_ids)))
    blobs: list[SyncBlob] = []
    used = 0
    for r in rows:
        if blobs and used + r["size_bytes"] > max_bytes:
            return Fetched(blobs, True)
        used += r["size_bytes"]
        blobs.append(
            SyncBlob(
                vault_id=r["vault_id"],
                memory_id=r["memory_id"],
                device_id=r["device_id"],
                vector_clock=r["vector_clock"],
                ciphertext=r["ciphertext"],
                hmac=r["hmac"],
                created_at=r["created_at"],
                deleted=r["deleted"],
            )
        )
    found = {b.memory_id for b in blobs}
    return Fetched(blobs, False, sorted(set(memory_ids) - found))
