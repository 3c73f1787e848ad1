"""Pushes on PostgreSQL (PROTOCOL §6, §9): one transaction for a group of pushes.

A group is one push, or several that arrived together (`relay.services.push_groups`). The
transaction first locks the row of every vault in the group, one statement per vault in
vault-id order, so two groups (in this process or another replica) never deadlock. It
then decides each push in arrival order exactly as if it ran alone after the ones before
it, and writes each vault's accepted blobs with one statement (on Citus each of these is
one task on the vault's shard: deploy/SCALING.md §3). Sequence numbers are handed out
under the vault locks, so sequence order equals commit order (§9). A push refused as a
whole (`relay.domain.domain_errors.QuotaExceededError`) gets that as its result and writes
nothing; the others in its group go on.

Two shapes of the same transaction (issue 36): a statement per table and vault
(`_push_per_table`: 7 round trips for a group of one vault, 9 for several), on Citus; on
plain PostgreSQL a group of one vault in 4 round trips and of several in 6
(`_push_at_once`: BEGIN with the locks, the reads in one statement for one vault and two
for several, the blobs and devices in one statement a vault sent pipelined, one vault's
row with COMMIT, several vaults' rows pipelined before it). `PushLimits.one_statement`
chooses; the decision (`PushDecision`) is the same value in both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import asyncpg
from msgspec.structs import replace

from engram_sync.relay.domain.domain_errors import (
    InvalidBatchError,
    PushRefusedError,
    QuotaExceededError,
    VaultRetiredError,
)
from engram_sync.relay.domain.push_rules import (
    CheckedBlob,
    PushPlan,
    StoredVersion,
    check_blobs,
    plan_push,
)
from engram_sync.relay.store.begun import Begun, begun, hex_bytea, hex_text
from engram_sync.relay.store.bucket_prefixes import PREFIX_SHIFT, apply_changes
from engram_sync.relay.store.carried_digest import CarriedDigest
from engram_sync.relay.store.feed_notify import INLINE_MAX_BLOBS, Commit, announce, encode_blobs
from engram_sync.relay.store.overlap import while_answered
from engram_sync.shared_format.digest import (
    bucket_and_version_hash,
    digest_bytes,
    digest_int,
    version_hash,
)
from engram_sync.shared_format.wire import SyncBlob


@dataclass(frozen=True)
class Quota:
    """Effective limits for one vault; 0 = unlimited."""

    max_devices: int
    max_bytes: int


@dataclass(frozen=True)
class PushLimits:
    """The relay's limits that every push is judged by."""

    max_blob_bytes: int
    default_quota: Quota
    announce: bool = True  # PROTOCOL §15: NOTIFY after commit (off: ENGRAM_RELAY_LIVE_FEED)
    # PROTOCOL §15: this process's own waiters, told of the commits at once (before the
    # NOTIFY's round trip, which the other processes' waiters wait for)
    published: Callable[[list[Commit]], None] | None = None
    # Issue 36: a group in four round trips (`_push_at_once`), on plain
    # PostgreSQL only: Citus refuses `WRITE_VAULT` (see `_UPDATE_VAULT`), so there a group
    # keeps the shape of one statement per table (`plain_postgres` tells them apart at
    # startup).
    one_statement: bool = False


@dataclass(frozen=True)
class PushJob:
    """One push request waiting for its transaction, structurally checked (§6 step 1), or
    with its blobs still `unchecked`: then its transaction checks them while the database
    reads (`checked_jobs`; issue 36: a push's check, 1.3 ms for 500 blobs, ran before its
    transaction began)."""

    vault_id: str
    checked: list[CheckedBlob]  # in request order: each one's `position` is its place
    bound_device: str | None  # the device a device-bound key may push for (§6 step 5)
    unchecked: list[SyncBlob] | None = None  # the request's blobs, `checked` then empty

    @classmethod
    def of_request(cls, vault_id: str, blobs: list[SyncBlob], bound: str | None) -> PushJob:
        """A push whose count was checked (`check_count`) and whose blobs were not yet."""
        return cls(vault_id, [], bound, unchecked=blobs)

    @property
    def size(self) -> int:
        """How many blobs the push holds."""
        return len(self.checked) if self.unchecked is None else len(self.unchecked)

    @property
    def blobs(self) -> list[SyncBlob]:
        """The pushed blobs, checked or not (their ids are what the reads ask for)."""
        return [c.blob for c in self.checked] if self.unchecked is None else self.unchecked


# A job of a group as its transaction sees it: checked, or refused by §6 step 1.
CheckedJob = PushJob | InvalidBatchError


def checked_jobs(jobs: list[PushJob]) -> list[CheckedJob]:
    """PROTOCOL §6 step 1 for every job not checked yet: the job with its `checked` blobs,
    or its refusal (`InvalidBlobError`, a 400 naming the blob, relay.http.errors), which
    leaves the group's other pushes to go on."""
    done: list[CheckedJob] = []
    for job in jobs:
        if job.unchecked is None:
            done.append(job)
            continue
        try:
            done.append(PushJob(job.vault_id, check_blobs(job.unchecked), job.bound_device))
        except InvalidBatchError as refused:
            done.append(refused)
    return done


@dataclass(frozen=True)
class PushOutcome:
    """What a committed push did."""

    plan: PushPlan
    cursor: int
    # ours: the vault's §18 digest and count as the committed group left them
    # (relay.store.carried_digest; `carried_in`)
    carried: CarriedDigest | None = None


# A refusal is a value here (one push of a group); relay.services.push_groups raises it.
PushResult = PushOutcome | PushRefusedError


@dataclass
class LockedVault:
    """One locked vault as its group goes: sequence, size, limits, active devices."""

    vault_id: str
    seq: int
    bytes_used: int
    live_blobs: int
    tombstones: int
    quota: Quota
    # PROTOCOL §18: the vault digest as an integer, XORed per accepted blob
    digest: int = 0
    # PROTOCOL §18 (revision 0012): the bucket prefixes and counts, as stored, then as
    # `_fold_digests` leaves them for `_write`
    bucket_prefixes: bytes = b""
    bucket_counts: bytes = b""
    # The group's accepted versions, each with the one it replaced, folded into the
    # digest and the bucket prefixes and counts by `_fold_digests` while the blobs are
    # written
    versions: list[_NewVersion] = field(default_factory=list)
    # Blobs held per non-revoked device, read on first need (device quota only).
    active_devices: Counter[str] | None = None
    # PROTOCOL §19: the refusal of a retired vault, read under the same lock
    retired: VaultRetiredError | None = None


# Made per blob of a push (500 a batch): named tuples cost under half of what frozen
# dataclasses cost to create (0.36 against 0.86 us).
class StoredBlob(NamedTuple):
    """A memory's stored version, the device that pushed it, and whether it is a tombstone."""

    version: StoredVersion
    device_id: str
    deleted: bool


class HeldWrite(NamedTuple):
    vault_id: str
    item: CheckedBlob
    seq: int


# An accepted blob as the digest sees it (PROTOCOL §18), and the stored version it replaced:
# hashed by `_fold_digests` while the blobs are written. A plain tuple: one is made per blob,
# at a seventh of a named tuple's cost.
_NewVersion = tuple[SyncBlob, StoredBlob | None]


def _bucket_and_hash(blob: SyncBlob) -> tuple[int, int]:
    return bucket_and_version_hash(blob.memory_id, blob.device_id, blob.vector_clock,
                                   blob.deleted)  # fmt: skip


# PROTOCOL §6: each vault's row is locked by its own statement, in vault-id order (sent
# pipelined with executemany: one round trip for the group). Citus refuses
# `vault_id = ANY(..) ... FOR UPDATE` even for one vault, and routes this form to the
# vault's shard as one task (deploy/SCALING.md §3).
_LOCK_VAULT = "SELECT 1 FROM vaults WHERE vault_id = $1 FOR UPDATE"

# Which of the group's vaults exist, read before the locks (see `push_group`).
_EXISTING_VAULTS = "SELECT vault_id FROM vaults WHERE vault_id = ANY($1::text[])"

# The locked rows with their quotas and retirement (PROTOCOL §19), read under the locks.
_VAULT_ROWS = (
    "SELECT v.vault_id, v.seq, v.bytes_used, v.live_blobs, v.tombstones, v.digest,"
    " v.bucket_prefixes, v.bucket_counts,"  # PROTOCOL §18, revision 0012
    " v.retired_at IS NOT NULL AS retired, v.successor,"  # PROTOCOL §19, under the lock
    " v.successor_statement, v.successor_stated_at,"  # §19, the successor statement (0016)
    " q.max_devices, q.max_bytes FROM vaults v"
    " LEFT JOIN quotas q ON q.vault_id = v.vault_id"
)
_READ_VAULTS = _VAULT_ROWS + " WHERE v.vault_id = ANY($1::text[])"
# A group of one vault (most of them): the row locked and read by one statement, two
# round trips fewer. Only an existing row is locked and read, by the same statement, so
# the race below (`push_group`) cannot happen; a missing vault gives no row.
_LOCK_READ_VAULT = _VAULT_ROWS + " WHERE v.vault_id = $1 FOR UPDATE OF v"

# Revoked devices among the pushers, and the stored version of every memory pushed, read
# by exact (vault, id) pairs, one statement per vault ($1: on Citus one task on the vault's
# shard; a LATERAL keyed by an unnest()ed vault id cannot be pushed down to the shards,
# deploy/SCALING.md §3), all of a group's sent pipelined (`fetchmany`: one round trip for
# the group, each row naming its vault). Each pair is one probe of the primary key: the LATERAL
# subquery with LIMIT 1 cannot be flattened into a join, so it is planned as a nested
# loop over the pairs whatever the tables' statistics say. (A join with unnest() got
# hash-joined against a sequential scan, slow over the dead row versions busy rows
# leave; `vault_id = ANY(..) AND memory_id = ANY(..)` read the cross product of a
# group's vaults and memories, which grows with the vaults: measured 27 -> 172 buffers
# per read over a 20 s run of 32 devices in a vault each.)
_READ_KNOWN = """
    SELECT $1::text AS vault_id, true AS revoked, k.id, 0::bigint AS clock, 0 AS size,
           k.id AS owner, false AS deleted
    FROM unnest($2::text[]) AS k(id)
    CROSS JOIN LATERAL (
        SELECT 1 FROM devices d WHERE d.vault_id = $1 AND d.device_id = k.id
            AND d.revoked_at IS NOT NULL LIMIT 1) AS d
    UNION ALL
    SELECT $1::text, false, k.id, b.vector_clock, b.size_bytes, b.device_id, b.deleted
    FROM unnest($3::text[]) AS k(id)
    CROSS JOIN LATERAL (
        SELECT vector_clock, size_bytes, device_id, deleted FROM blobs b
        WHERE b.vault_id = $1 AND b.memory_id = k.id LIMIT 1) AS b
"""

# Non-revoked devices holding blobs in a vault, with how many. A device row alone (a label
# registration, a pull with X-Engram-Device) takes no slot, else it would bypass the quota.
_ACTIVE_DEVICES = (
    "SELECT b.device_id, count(*) AS n FROM blobs b WHERE b.vault_id = $1 AND NOT EXISTS"
    " (SELECT 1 FROM devices d WHERE d.vault_id = $1 AND d.device_id = b.device_id"
    " AND d.revoked_at IS NOT NULL) GROUP BY b.device_id"
)

# The set-based blob upsert of one vault: one row per unnest position, no per-blob round
# trips. Every row goes to the vault of the first one ($1[1]; the push writes one
# statement per vault) and a row of another vault is left out. The vault row joined in
# by that id is what makes it one task on the vault's shard on Citus (an `INSERT ..
# SELECT FROM unnest(..)` alone is planned "pull to coordinator"), and `received_at`
# takes the inserted row's default, now(): Citus refuses now() in DO UPDATE SET
# (deploy/SCALING.md §3). Public: the benchmark's raw-database ceiling runs this very
# statement (bench/ceiling.py).
BLOB_UPSERT = """
    INSERT INTO blobs (vault_id, memory_id, device_id, vector_clock, ciphertext, hmac,
                       created_at, created_at_ts, deleted, seq, size_bytes)
    SELECT v.vault_id, u.memory_id, u.device_id, u.vector_clock, u.ciphertext, u.hmac,
           u.created_at, u.created_at_ts, u.deleted, u.seq, u.size_bytes
    FROM vaults v, unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[],
                          $6::text[], $7::text[], $8::timestamptz[], $9::boolean[],
                          $10::bigint[], $11::integer[])
        AS u(vault_id, memory_id, device_id, vector_clock, ciphertext, hmac, created_at,
             created_at_ts, deleted, seq, size_bytes)
    WHERE v.vault_id = ($1::text[])[1] AND u.vault_id = v.vault_id
    ON CONFLICT (vault_id, memory_id) DO UPDATE SET
        device_id = EXCLUDED.device_id, vector_clock = EXCLUDED.vector_clock,
        ciphertext = EXCLUDED.ciphertext, hmac = EXCLUDED.hmac,
        created_at = EXCLUDED.created_at, created_at_ts = EXCLUDED.created_at_ts,
        deleted = EXCLUDED.deleted, seq = EXCLUDED.seq,
        size_bytes = EXCLUDED.size_bytes, received_at = EXCLUDED.received_at
"""

# Per vault written, after its blobs: its new sequence, size, counts, digest and bucket
# prefixes and counts (PROTOCOL §18, revision 0012: in the same statement), and its
# pushing devices' last_seen (EXCLUDED.last_seen: the inserted row's now(), as above).
# Each is one task on the vault's shard on Citus. (One CTE of the three was refused at
# execution there: "INSERT has more target columns than expressions".)
_UPDATE_VAULT = (
    "UPDATE vaults SET seq = $2, bytes_used = $3, live_blobs = $4, tombstones = $5,"
    " digest = $6, bucket_prefixes = $7, bucket_counts = $8 WHERE vault_id = $1"
)
_SEEN_DEVICES = (
    "INSERT INTO devices (vault_id, device_id)"
    " SELECT v.vault_id, d.device_id FROM vaults v, unnest($2::text[]) AS d(device_id)"
    " WHERE v.vault_id = $1"
    " ON CONFLICT (vault_id, device_id) DO UPDATE SET last_seen = EXCLUDED.last_seen"
)


# Issue 36, plain PostgreSQL (`_push_at_once`): a vault's blobs and
# its pushing devices' last_seen written by one statement, the two above as data-modifying
# CTEs ($1-$11 the upsert's arrays, $12 the vault, $13 the devices; Citus refuses it), while
# the digest is folded; the vault row's update then goes with COMMIT (`_vault_update_sql`).
# Both CTEs read `vaults` only to join its id. Public: the round-trip test names it.
WRITE_VAULT = f"""
    WITH written AS ({BLOB_UPSERT}),
    seen AS (
        INSERT INTO devices (vault_id, device_id)
        SELECT v.vault_id, d.device_id FROM vaults v, unnest($13::text[]) AS d(device_id)
        WHERE v.vault_id = $12
        ON CONFLICT (vault_id, device_id) DO UPDATE SET last_seen = EXCLUDED.last_seen)
    SELECT 1
"""  # noqa: S608 - constants

# Issue 36, plain PostgreSQL (`_push_at_once`): after the locks (their
# own statement, sent with BEGIN), the vault's row and the rows of `_READ_KNOWN` in one
# statement, hence one snapshot taken under the lock. The vault's row comes first and
# alone has `is_vault`; the NULLs of each branch take the other branch's column types.
_READ_VAULT_AND_KNOWN = f"""
    SELECT true AS is_vault, v.vault_id, v.seq, v.bytes_used, v.live_blobs, v.tombstones,
           v.digest, v.bucket_prefixes, v.bucket_counts,  -- PROTOCOL §18, revision 0012
           v.retired_at IS NOT NULL AS retired, v.successor, v.successor_statement,
           v.successor_stated_at, q.max_devices, q.max_bytes,
           NULL AS revoked, NULL AS id, NULL AS clock, NULL AS size, NULL AS owner,
           NULL AS deleted
    FROM vaults v LEFT JOIN quotas q ON q.vault_id = v.vault_id WHERE v.vault_id = $1
    UNION ALL
    SELECT false, k.vault_id, NULL, NULL, NULL, NULL,
           NULL, NULL, NULL,  -- the digest, bucket prefixes and counts
           NULL, NULL, NULL, NULL, NULL, NULL,
           k.revoked, k.id, k.clock, k.size, k.owner, k.deleted
    FROM ({_READ_KNOWN}) AS k
"""  # noqa: S608 - constants


async def plain_postgres(conn: asyncpg.Connection) -> bool:
    """Whether the relay's database is plain PostgreSQL (no Citus extension): then a push
    group may use the one-statement shape (`PushLimits.one_statement`)."""
    return not await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"
    )


def blob_columns(rows: list[tuple[str, CheckedBlob, int]]) -> list[list[Any]]:
    """The eleven arrays of `BLOB_UPSERT` for (vault_id, blob, seq) rows of one vault
    (a comprehension per column: 0.18 ms for 500 rows, where appending row by row took
    0.75 ms)."""
    blobs = [item.blob for _, item, _ in rows]
    return [
        [vault_id for vault_id, _, _ in rows],
        [b.memory_id for b in blobs],
        [b.device_id for b in blobs],
        [b.vector_clock for b in blobs],
        [b.ciphertext for b in blobs],
        [b.hmac for b in blobs],
        [b.created_at for b in blobs],
        [item.created_at_ts for _, item, _ in rows],
        [b.deleted for b in blobs],
        [seq for _, _, seq in rows],
        [item.size_bytes for _, item, _ in rows],
    ]


async def push_group(
    pool: asyncpg.Pool,
    jobs: list[PushJob],
    limits: PushLimits,
    committed: Callable[[list[PushResult]], None] | None = None,
) -> list[PushResult]:
    """Run the pushes as one transaction; one result per job, in order.

    A database failure raises (and nothing of the group is written); a push refused as
    a whole is its `PushRefusedError` in its place of the result list. `committed` is
    given the results as soon as the group committed, before the NOTIFY's round trip
    (relay.services.push_groups answers the pushes with them: issue 36).
    """
    vault_ids = sorted({job.vault_id for job in jobs})
    async with pool.acquire() as conn:
        done = None
        if limits.one_statement:  # the jobs' §6 step 1 checked while it reads (issue 36)
            done = await _push_at_once(conn, jobs, vault_ids, limits)
        if done is None:  # Citus, or a vault of the group does not exist yet
            done = await _checked_first(conn, jobs, limits)
        if committed is not None:
            committed(done)
        # PROTOCOL §15: committed now. This process's waiters first, then one NOTIFY per
        # vault of the group, on the same connection, outside the transaction (a failure
        # is only logged).
        commits = committed_changes(jobs, done)
        if limits.published is not None:
            limits.published(commits)
        if limits.announce:
            await announce(conn, commits)
        return done


async def _checked_first(
    conn: asyncpg.Connection, jobs: list[PushJob], limits: PushLimits
) -> list[PushResult]:
    """The group with §6 step 1 checked before its transaction (the shape Citus needs, and
    the first push to a vault: no vault is created for a push the check refuses); the
    valid pushes then run, each vault they need created first."""
    checked = checked_jobs(jobs)
    valid = [job for job in checked if isinstance(job, PushJob)]
    results = iter(await _creating_vaults(conn, valid, limits) if valid else [])
    return [job if isinstance(job, InvalidBatchError) else next(results) for job in checked]


async def _creating_vaults(
    conn: asyncpg.Connection, jobs: list[PushJob], limits: PushLimits
) -> list[PushResult]:
    """The group's transaction, after creating the vaults of the group that do not exist:
    the per-table shape names them (`push_group` already found the four-round-trip shape
    short of one); once they exist, plain PostgreSQL takes that shape again."""
    vault_ids = sorted({job.vault_id for job in jobs})
    while True:
        done, missing = await _push_per_table(conn, jobs, vault_ids, limits)
        if done is not None:
            return done
        # First push to a vault: its row is created on its own and committed, outside
        # the locking transaction, so no transaction ever holds a row it inserted while
        # it waits for another vault's lock (which could deadlock two groups).
        # PROTOCOL §13: a vault nobody owns at its first push was reached by an operator
        # key (an account's keys exist only for vaults it owns or was granted), so this
        # first push claims it for the operator.
        await conn.execute(
            "WITH claim AS (INSERT INTO vault_owners (vault_id, owner)"
            " SELECT unnest($1::text[]), 'operator' ON CONFLICT DO NOTHING)"
            " INSERT INTO vaults (vault_id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING",
            missing,
        )
        if limits.one_statement:
            at_once = await _push_at_once(conn, jobs, vault_ids, limits)
            if at_once is not None:
                return at_once


async def _push_per_table(
    conn: asyncpg.Connection, jobs: list[PushJob], vault_ids: list[str], limits: PushLimits
) -> tuple[list[PushResult] | None, list[str]]:
    """The group in one transaction, a statement per table: the shape Citus needs (and that
    plain PostgreSQL keeps for a group of several vaults). (results, []) once done, or
    (None, the vaults to create first)."""
    async with conn.transaction():
        # Only a vault that exists before its lock statement runs is locked by it, and
        # each READ COMMITTED statement sees what committed before it: a vault created
        # between the lock and the read would be read without its lock (a group holding
        # that lock then deadlocked with this one, and both could take the same sequence
        # numbers). So the locks are taken only once every vault of the group exists.
        if len(vault_ids) == 1:
            rows = await conn.fetch(_LOCK_READ_VAULT, vault_ids[0])
            locked = _locked(rows, limits.default_quota)
            missing = [] if locked else vault_ids
        else:
            existing = await conn.fetch(_EXISTING_VAULTS, vault_ids)
            missing = sorted(set(vault_ids) - {r["vault_id"] for r in existing})
            if not missing:
                locked = await _lock_vaults(conn, vault_ids, limits.default_quota)
                missing = [v for v in vault_ids if v not in locked]  # deleted since
        if missing:
            return None, missing
        known, checked = await _read_known(conn, jobs)
        decision = PushDecision.read(locked, known, limits.max_blob_bytes)
        return await _decide_and_write(conn, checked, decision), []


async def _push_at_once(
    conn: asyncpg.Connection, jobs: list[PushJob], vault_ids: list[str], limits: PushLimits
) -> list[PushResult] | None:
    """Issue 36, plain PostgreSQL (`PushLimits.one_statement`): a group in four round trips
    for one vault and six for several, where `_push_per_table` takes seven and nine.
    BEGIN travels with the vaults' lock (`relay.store.begun`, the ids spelled in hex; one
    statement locking the rows in vault-id order, `_lock_sql`); one vault's row and stored
    versions come in one statement read under the lock (`_read_one_vault`), several
    vaults' in two (`_READ_VAULTS`, then `_read_known`); the blobs and devices are written
    by one statement a vault (`WRITE_VAULT`, pipelined) while the digest is folded; one
    vault's row update travels with COMMIT, several vaults' go pipelined before it. None
    when a vault of the group does not exist yet (the lock statement locked fewer rows;
    `push_group` then takes the per-table shape, which names the vaults to create)."""
    async with begun(conn, _lock_sql(vault_ids)) as transaction:
        if transaction.status != f"SELECT {len(vault_ids)}":
            return None
        if len(vault_ids) == 1:
            locked, known, checked = await _read_one_vault(conn, jobs, vault_ids[0], limits)
        else:
            locked = _locked(await conn.fetch(_READ_VAULTS, vault_ids), limits.default_quota)
            known, checked = await _read_known(conn, jobs)
        decision = PushDecision.read(locked, known, limits.max_blob_bytes)
        return await _decide_and_write(conn, checked, decision, transaction)


async def _read_one_vault(
    conn: asyncpg.Connection, jobs: list[PushJob], vault_id: str, limits: PushLimits
) -> tuple[dict[str, LockedVault], list[asyncpg.Record], list[CheckedJob]]:
    """A group of one vault (most of them): its row and its stored versions in one
    statement (`_READ_VAULT_AND_KNOWN`); with the group's §6 step 1 (`checked_jobs`), done
    while it runs. For several vaults, that statement a vault costs more than the two
    statements of `_push_per_table` (measured: 8.5 against 2.2 ms for 32 vaults). The ids
    read may be a refused push's: its rows then decide nothing."""
    pushers, memories = _pushers_and_memories(jobs)
    rows, checked = await while_answered(
        conn.fetch(
            _READ_VAULT_AND_KNOWN, vault_id, sorted(pushers[vault_id]),
            sorted(memories[vault_id]),
        ),
        lambda: checked_jobs(jobs),
    )  # fmt: skip
    locked = _locked([r for r in rows if r["is_vault"]], limits.default_quota)
    return locked, [r for r in rows if not r["is_vault"]], checked


async def _read_known(
    conn: asyncpg.Connection, jobs: list[PushJob]
) -> tuple[list[asyncpg.Record], list[CheckedJob]]:
    """The rows of `_READ_KNOWN` for every vault of the group (one statement a vault, sent
    pipelined), with the group's §6 step 1 (`checked_jobs`), done while they are read."""
    pushers, memories = _pushers_and_memories(jobs)
    return await while_answered(
        conn.fetchmany(
            _READ_KNOWN,
            [(v, sorted(pushers[v]), sorted(memories[v])) for v in sorted(pushers)],
        ),
        lambda: checked_jobs(jobs),
    )


def _lock_sql(vault_ids: list[str]) -> str:
    """The lock of `_push_at_once`: every vault's row FOR UPDATE, locked in vault-id order
    (the rows are locked as the sort hands them over; "C": code point order, the order
    `sorted` gives `_push_per_table`'s locks, so two groups never deadlock), without
    parameters to go with BEGIN: the ids in hex digits only."""
    ids = ", ".join(hex_text(v) for v in vault_ids)
    return (
        f"SELECT 1 FROM vaults WHERE vault_id IN ({ids})"  # noqa: S608 - hex digits only
        ' ORDER BY vault_id COLLATE "C" FOR UPDATE'
    )


def _pushers_and_memories(jobs: list[PushJob]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Per vault, the devices pushing to it and the memories pushed."""
    pushers: dict[str, set[str]] = {}
    memories: dict[str, set[str]] = {}
    for j in jobs:
        blobs = j.blobs
        pushers.setdefault(j.vault_id, set()).update(b.device_id for b in blobs)
        memories.setdefault(j.vault_id, set()).update(b.memory_id for b in blobs)
    return pushers, memories


def committed_changes(jobs: list[PushJob], results: list[PushResult]) -> list[Commit]:
    """Each vault a group wrote to: its sequence before and after the group's commit and,
    for a small commit, the blobs written (PROTOCOL §15; docs/live-feed.md "Blobs in the
    event"). A push's accepted blobs took the sequence numbers after the vault's, in
    order (`PushDecision.accept`), and a later push of the group replaced an earlier one's blob of
    the same memory before anything was written: what is left is what a pull gives."""
    spans: dict[str, list[int]] = {}  # vault -> [after, seq]
    written: dict[str, dict[str, tuple[int, SyncBlob]]] = {}
    for job, result in zip(jobs, results, strict=True):
        if not (isinstance(result, PushOutcome) and result.plan.accepted):
            continue
        accepted = result.plan.accepted
        first = result.cursor - len(accepted)
        span = spans.setdefault(job.vault_id, [first, result.cursor])
        span[1] = result.cursor
        rows = written.setdefault(job.vault_id, {})
        if len(rows) + len(accepted) <= INLINE_MAX_BLOBS:  # else the commit carries none
            for seq, item in enumerate(accepted, start=first + 1):
                rows[item.blob.memory_id] = (seq, item.blob)
    commits = []
    for vault_id, (after, seq) in spans.items():
        rows = written[vault_id]
        blobs = None
        if rows and seq - after <= INLINE_MAX_BLOBS:
            blobs = encode_blobs(
                [replace(b, vault_id=vault_id, seq=s) for s, b in sorted(rows.values())]
            )
        commits.append(Commit(vault_id, after, seq, blobs))
    return commits


async def _lock_vaults(
    conn: asyncpg.Connection, vault_ids: list[str], default: Quota
) -> dict[str, LockedVault]:
    """The vaults' rows, locked for this transaction (PROTOCOL §6), with quotas; every one
    of `vault_ids` existed before (see `push_group`)."""
    await conn.executemany(_LOCK_VAULT, [(vault_id,) for vault_id in vault_ids])
    return _locked(await conn.fetch(_READ_VAULTS, vault_ids), default)


def _locked(rows: list[asyncpg.Record], default: Quota) -> dict[str, LockedVault]:
    return {
        r["vault_id"]: LockedVault(
            r["vault_id"],
            r["seq"],
            r["bytes_used"],
            r["live_blobs"],
            r["tombstones"],
            Quota(
                default.max_devices if r["max_devices"] is None else r["max_devices"],
                default.max_bytes if r["max_bytes"] is None else r["max_bytes"],
            ),
            digest=digest_int(r["digest"]),
            bucket_prefixes=r["bucket_prefixes"],
            bucket_counts=r["bucket_counts"],
            retired=VaultRetiredError(
                r["vault_id"], r["successor"], r["successor_statement"], r["successor_stated_at"]
            )
            if r["retired"]
            else None,
        )
        for r in rows
    }


async def _decide_and_write(
    conn: asyncpg.Connection,
    jobs: list[CheckedJob],
    decision: PushDecision,
    transaction: Begun | None = None,
) -> list[PushResult]:
    results: list[PushResult] = []
    for job in jobs:
        if isinstance(job, InvalidBatchError):  # refused by §6 step 1 (`checked_jobs`)
            results.append(job)
            continue
        try:
            results.append(await _decide(conn, decision, job))
        except PushRefusedError as refused:  # this push alone is refused (quota)
            results.append(refused)
    if decision.writes:
        # Every device that had a blob accepted was seen, even if a later push of the
        # group replaced that blob before it was ever written.
        seen = {(j.vault_id, c.blob.device_id) for j, r in zip(jobs, results, strict=True)
                if isinstance(r, PushOutcome) and isinstance(j, PushJob)
                for c in r.plan.accepted}  # fmt: skip
        writes = list(decision.writes.values())
        changed = sorted({w.vault_id for w in writes})
        vaults = [decision.vaults[v] for v in changed]
        await _write(conn, writes, vaults, sorted(seen), transaction)
    return carried_in(results, jobs, decision.vaults)


def carried_in(
    results: list[PushResult], jobs: list[CheckedJob], vaults: Mapping[str, LockedVault]
) -> list[PushResult]:
    """Each push's result with its vault's digest, count and sequence as the group leaves
    them (ours, relay.store.carried_digest): folded by `_write`, written with `seq` by the
    statement that commits, so they describe the vault at that sequence. A later push of
    the same group makes it a sequence past the push's own `cursor`."""
    return [
        _with_carried(r, vaults[job.vault_id])
        if isinstance(r, PushOutcome) and isinstance(job, PushJob)
        else r
        for job, r in zip(jobs, results, strict=True)
    ]


def _with_carried(outcome: PushOutcome, v: LockedVault) -> PushOutcome:
    carried = CarriedDigest(v.seq, v.live_blobs + v.tombstones, digest_bytes(v.digest))
    return PushOutcome(outcome.plan, outcome.cursor, carried)


async def _decide(conn: asyncpg.Connection, decision: PushDecision, job: PushJob) -> PushOutcome:
    """Steps 2-7 and the quota for one push, on the state the pushes before it left: the
    decision answers, and the vault's active devices are read the first time its device
    quota needs them."""
    stored = decision.stored_versions(job)
    plan = decision.plan(job, stored)
    if not plan.accepted:
        return PushOutcome(plan=plan, cursor=decision.vaults[job.vault_id].seq)
    if decision.needs_active_devices(job):
        rows = await conn.fetch(_ACTIVE_DEVICES, job.vault_id)
        decision.vaults[job.vault_id].active_devices = Counter(
            {r["device_id"]: r["n"] for r in rows}
        )
    new_bytes = decision.projected_bytes(job, plan, stored)
    return decision.accept(job, plan, new_bytes)


@dataclass
class PushDecision:
    """The decision of one push group (PROTOCOL §6 steps 2-7 and the quota), push by push in
    arrival order, as a value: each push is judged on what the pushes before it left.

    It holds the decision's inputs: the group's locked vaults (sequence, counts, quota,
    retirement), the stored version of every memory pushed and the revoked devices among
    the pushers (`read` from the rows `_READ_KNOWN` gave under the locks), and the writes
    held so far (a later push's blob of a memory replaces an earlier one's before anything
    is written). No I/O: `_decide` asks it and reads what it lacks (a vault's active
    devices); tests ask it directly (tests/relay/store/test_push_decision.py)."""

    vaults: dict[str, LockedVault]
    stored: dict[tuple[str, str], StoredBlob]  # (vault, memory) -> the version stored
    revoked: set[tuple[str, str]]  # (vault, device): revoked devices among the pushers
    max_blob_bytes: int
    writes: dict[tuple[str, str], HeldWrite] = field(default_factory=dict)
    # pushes accepted and not yet among `stored`: made stored versions only when a later
    # push of the group is judged (issue 36: two named tuples a blob, most groups being
    # one push); `_store_accepted`
    unstored: list[tuple[str, list[CheckedBlob]]] = field(default_factory=list)

    @classmethod
    def read(
        cls,
        vaults: dict[str, LockedVault],
        known: Iterable[Mapping[str, Any]],
        max_blob_bytes: int,
    ) -> PushDecision:
        """The decision over `vaults` from the rows of `_READ_KNOWN` (a revoked device, or a
        memory's stored version)."""
        revoked: set[tuple[str, str]] = set()
        stored: dict[tuple[str, str], StoredBlob] = {}
        for r in known:
            if r["revoked"]:
                revoked.add((r["vault_id"], r["id"]))
            else:
                stored[(r["vault_id"], r["id"])] = StoredBlob(
                    StoredVersion(r["clock"], r["size"]), r["owner"], r["deleted"]
                )
        return cls(vaults, stored, revoked, max_blob_bytes)

    def stored_versions(self, job: PushJob) -> dict[str, StoredVersion]:
        """The version the vault holds of each memory `job` pushes, where it holds one."""
        self._store_accepted()
        stored, vault_id = self.stored, job.vault_id
        memory_ids = {c.blob.memory_id for c in job.checked}
        return {m: stored[key].version for m in memory_ids if (key := (vault_id, m)) in stored}

    def plan(self, job: PushJob, stored: dict[str, StoredVersion]) -> PushPlan:
        """Steps 2-7 for `job` (`stored`: its `stored_versions`); VaultRetiredError when the
        vault was retired (PROTOCOL §19: from the retire on, every push is refused)."""
        gone = self.vaults[job.vault_id].retired
        if gone is not None:
            raise VaultRetiredError(job.vault_id, gone.successor, gone.statement, gone.stated_at)
        device_ids = {c.blob.device_id for c in job.checked}
        return plan_push(
            job.checked,
            vault_id=job.vault_id,
            bound_device=job.bound_device,
            max_blob_bytes=self.max_blob_bytes,
            revoked={d for d in device_ids if (job.vault_id, d) in self.revoked},
            stored=stored,
        )

    def needs_active_devices(self, job: PushJob) -> bool:
        """True when the device quota of `job`'s vault must count its devices and they were
        not read yet (`LockedVault.active_devices`)."""
        vault = self.vaults[job.vault_id]
        return vault.quota.max_devices > 0 and vault.active_devices is None

    def projected_bytes(
        self, job: PushJob, plan: PushPlan, stored: dict[str, StoredVersion]
    ) -> int:
        """The vault's bytes with `plan` accepted; QuotaExceededError when its devices or
        bytes would grow past the quota (PROTOCOL §6). Only growth is refused: a vault
        already over a lowered limit keeps syncing."""
        vault = self.vaults[job.vault_id]
        new_bytes = vault.bytes_used + sum(
            item.size_bytes - (stored[m].size_bytes if (m := item.blob.memory_id) in stored else 0)
            for item in plan.accepted
        )
        quota = vault.quota
        if quota.max_devices > 0:
            if vault.active_devices is None:
                raise RuntimeError("the vault's active devices were not read")
            known = {device for device, blobs in vault.active_devices.items() if blobs > 0}
            devices = known | {i.blob.device_id for i in plan.accepted}
            if len(devices) > quota.max_devices and len(devices) > len(known):
                raise QuotaExceededError("devices", quota.max_devices, len(devices))
        if quota.max_bytes > 0 and new_bytes > max(quota.max_bytes, vault.bytes_used):
            raise QuotaExceededError("bytes", quota.max_bytes, new_bytes)
        return new_bytes

    def accept(self, job: PushJob, plan: PushPlan, new_bytes: int) -> PushOutcome:
        """`plan`'s accepted blobs taken: each gets the vault's next sequence number and is
        held for writing (replacing an earlier push's blob of the same memory), becomes the
        stored version the next push is judged on, and moves the vault's counts; kept, with
        the version it replaced, for the digest's fold (PROTOCOL §18)."""
        self._store_accepted()  # an earlier push's versions are what this one replaces
        vault = self.vaults[job.vault_id]
        stored, writes = self.stored, self.writes
        for item in plan.accepted:
            vault.seq += 1
            blob = item.blob
            memory_id = blob.memory_id
            key = (job.vault_id, memory_id)
            writes[key] = HeldWrite(job.vault_id, item, vault.seq)  # a later push's wins
            replaced = stored.get(key)  # a push accepts a memory once (§6 step 7)
            deleted = blob.deleted
            # PROTOCOL §18: the new version in and the replaced one out, hashed by
            # `_fold_digests` while the blobs are written (under the vault lock already held)
            vault.versions.append((blob, replaced))
            if replaced is not None:
                vault.live_blobs -= not replaced.deleted  # the counts of /health and stats
                vault.tombstones -= replaced.deleted
            vault.live_blobs += not deleted
            vault.tombstones += deleted
            if vault.active_devices is not None:  # keep the device counts of the quota exact
                if replaced is not None and vault.active_devices[replaced.device_id] > 0:
                    vault.active_devices[replaced.device_id] -= 1
                vault.active_devices[item.blob.device_id] += 1
        vault.bytes_used = new_bytes
        self.unstored.append((job.vault_id, plan.accepted))
        return PushOutcome(plan=plan, cursor=vault.seq)

    def _store_accepted(self) -> None:
        """The versions accepted so far become the stored versions a later push is judged on."""
        stored = self.stored
        for vault_id, accepted in self.unstored:
            for item in accepted:
                blob = item.blob
                stored[(vault_id, blob.memory_id)] = StoredBlob(
                    StoredVersion(blob.vector_clock, item.size_bytes), blob.device_id, blob.deleted
                )
        self.unstored.clear()


def _fold_digests(vaults: list[LockedVault]) -> None:
    """PROTOCOL §18: each vault's accepted versions of the group into its digest (each in,
    the one it replaced out: O(1) a blob) and its buckets' prefixes (the first 8 bytes of
    the same XOR, revision 0012) and counts (a memory new to the vault: one more). Run
    while the blobs are written (`_write`), the new versions' buckets and hashes with it
    (issue 36: they were computed while the stored versions were read, a window §6 step 1's
    check now fills)."""
    for vault in vaults:
        xors: dict[int, int] = {}  # per bucket: the XOR of the changes' first 8 bytes
        added: dict[int, int] = {}  # per bucket: memories new to the vault
        digest = vault.digest
        for blob, old in vault.versions:
            memory_id = blob.memory_id
            bucket, change = _bucket_and_hash(blob)
            if old is None:
                added[bucket] = added.get(bucket, 0) + 1
            else:
                change ^= version_hash(memory_id, old.device_id, old.version.vector_clock,
                                       old.deleted)  # fmt: skip
            digest ^= change
            xors[bucket] = xors.get(bucket, 0) ^ (change >> PREFIX_SHIFT)
        vault.digest = digest
        vault.versions.clear()
        vault.bucket_prefixes, vault.bucket_counts = apply_changes(
            vault.bucket_prefixes, vault.bucket_counts, xors, added
        )


async def _write(
    conn: asyncpg.Connection,
    writes: list[HeldWrite],
    vaults: list[LockedVault],
    devices: list[tuple[str, str]],
    transaction: Begun | None,
) -> None:
    """The blobs, vault rows and devices of each vault, in vault-id order, inside the
    group's transaction (on Citus a group over several shards commits with two-phase
    commit), the digest folded while the blobs are written (PROTOCOL §18). In a
    `transaction` of `begun` (plain PostgreSQL, issue 36): the blobs and devices by one
    statement a vault (`WRITE_VAULT`, pipelined), one vault's row sent with COMMIT. Else one
    statement per table for every vault of the group, each sent pipelined (three round
    trips a group)."""
    rows: dict[str, list[tuple[str, CheckedBlob, int]]] = {v.vault_id: [] for v in vaults}
    for w in writes:
        rows[w.vault_id].append(w)
    seen: dict[str, list[str]] = {v.vault_id: [] for v in vaults}
    for vault_id, device_id in devices:
        seen[vault_id].append(device_id)
    if transaction is not None:
        # one vault (most groups): execute, whose arrays asyncpg encodes without the
        # per-argument checks executemany makes (py-spy: 5% of a push's CPU)
        statement = (
            conn.execute(WRITE_VAULT, *_write_row(vaults[0], rows, seen))
            if len(vaults) == 1
            else conn.executemany(WRITE_VAULT, [_write_row(v, rows, seen) for v in vaults])
        )
        await while_answered(statement, lambda: _fold_digests(vaults))
        if len(vaults) == 1:  # with COMMIT, spelled out (`_vault_update_sql`)
            transaction.with_commit.append(_vault_update_sql(vaults[0]))
        else:  # spelled out, 128 vaults' rows took 22 ms to parse against 3 ms for these
            await conn.executemany(_UPDATE_VAULT, [_vault_row(v) for v in vaults])
        return
    # Each statement for every vault of the group in one pipelined round trip; the
    # digest's hashing meanwhile (PROTOCOL §18).
    await while_answered(
        conn.executemany(BLOB_UPSERT, [blob_columns(rows[v.vault_id]) for v in vaults]),
        lambda: _fold_digests(vaults),
    )
    await conn.executemany(_UPDATE_VAULT, [_vault_row(v) for v in vaults])
    await conn.executemany(_SEEN_DEVICES, [(v.vault_id, seen[v.vault_id]) for v in vaults])


def _write_row(
    v: LockedVault,
    rows: dict[str, list[tuple[str, CheckedBlob, int]]],
    seen: dict[str, list[str]],
) -> tuple[Any, ...]:
    """The parameters of `WRITE_VAULT` for `v`: its blobs' arrays, its id, its devices."""
    return (*blob_columns(rows[v.vault_id]), v.vault_id, seen[v.vault_id])


def _vault_update_sql(v: LockedVault) -> str:
    """`_UPDATE_VAULT` for `v` without parameters, to go with COMMIT (`relay.store.begun`):
    numbers, and the id and the bytes in hex digits only."""
    counts = (
        f"seq = {int(v.seq)}, bytes_used = {int(v.bytes_used)},"
        f" live_blobs = {int(v.live_blobs)}, tombstones = {int(v.tombstones)},"
        f" digest = {hex_bytea(digest_bytes(v.digest))},"
        f" bucket_prefixes = {hex_bytea(v.bucket_prefixes)},"
        f" bucket_counts = {hex_bytea(v.bucket_counts)}"  # PROTOCOL §18, revision 0012
    )
    return f"UPDATE vaults SET {counts} WHERE vault_id = {hex_text(v.vault_id)}"  # noqa: S608


def _vault_row(v: LockedVault) -> tuple[Any, ...]:
    """The parameters of `_UPDATE_VAULT` for `v`."""
    return (
        v.vault_id, v.seq, v.bytes_used, v.live_blobs, v.tombstones,
        digest_bytes(v.digest),
        v.bucket_prefixes, v.bucket_counts,  # PROTOCOL §18, revision 0012
    )  # fmt: skip
