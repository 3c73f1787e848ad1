"""The anti-entropy digest on the relay (PROTOCOL §18, docs/digest.md), over real HTTP.

Every expected digest here is computed by this file from the blob rows with hashlib,
independently of `shared_format.digest` and of the relay's SQL.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import asyncpg
import httpx
import pytest

from engram_sync.relay.store.compaction import compact_vault
from engram_sync.relay.store.digest import bucket_of_sql, narrow
from tests.relay.conftest import Relay
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    module_relay_fixture,
    new_vault_id,
    push_ok,
    run_db,
)

relay = module_relay_fixture()
MIGRATION = Path(__file__).resolve().parents[3] / "relay/migrations/versions/0008_digest.py"


def _version(memory_id: str, device_id: str, clock: int, deleted: bool) -> bytes:
    return hashlib.sha256(
        memory_id.encode() + b"\x00" + device_id.encode() + b"\x00"
        + clock.to_bytes(8, "little") + (b"\x01" if deleted else b"\x00")
    ).digest()  # fmt: skip


def _xor(hashes: list[bytes]) -> str:
    value = 0
    for h in hashes:
        value ^= int.from_bytes(h, "big")
    return base64.b64encode(value.to_bytes(32, "big")).decode()


def _bucket(memory_id: str) -> int:
    return hashlib.sha256(memory_id.encode()).digest()[0]


def _rows(relay: Relay, vault: str) -> list[asyncpg.Record]:
    async def work(conn: asyncpg.Connection) -> list[asyncpg.Record]:
        # each row's bucket as the relay's bucket answers compute it (revision 0014)
        return await conn.fetch(
            "SELECT memory_id, device_id, vector_clock, deleted,"
            f" {bucket_of_sql('memory_id')} AS digest_bucket FROM blobs WHERE vault_id = $1",
            vault,
        )

    return run_db(relay.database_url, work)


def _expected(relay: Relay, vault: str, bucket: int | None = None) -> tuple[int, str]:
    rows = [r for r in _rows(relay, vault) if bucket is None or _bucket(r["memory_id"]) == bucket]
    hashes = [
        _version(r["memory_id"], r["device_id"], r["vector_clock"], r["deleted"]) for r in rows
    ]
    return len(rows), _xor(hashes)


def _digest(http: httpx.Client, vault: str, **params: Any) -> dict[str, Any]:
    response = http.get(f"/v1/vaults/{vault}/digest", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture
def http(relay: Relay) -> Any:
    with client(relay) as c:
        yield c


def test_an_empty_vault_has_the_zero_digest(http: httpx.Client) -> None:
    assert _digest(http, new_vault_id()) == {
        "cursor": 0,
        "count": 0,
        "digest": base64.b64encode(bytes(32)).decode(),
    }


def test_pushes_keep_the_digest_of_the_current_versions(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    other = Sealer(vault, sealer.keys)
    push_ok(http, vault, [sealer.blob(f"m{i}", 1) for i in range(20)])
    push_ok(http, vault, [other.blob("m1", 5), sealer.blob("m2", 2, deleted=True)])
    body = push_ok(http, vault, [sealer.blob("m3", 1), sealer.blob("m4", 3), sealer.blob("m4", 4)])
    assert body["accepted"] == 1
    assert sorted(body["rejected"]) == ["m3", "m4"]
    answer = _digest(http, vault)
    count, digest = _expected(relay, vault)
    assert (answer["count"], answer["digest"]) == (count, digest) == (20, digest)
    assert answer["cursor"] == 23
    # the digest really covers the versions: m1 is other's clock 5, m2 a tombstone
    hashes = [
        _version(f"m{i}", sealer.device_id, 1, False) for i in range(20) if i not in (1, 2, 4)
    ]
    hashes += [
        _version("m1", other.device_id, 5, False),
        _version("m2", sealer.device_id, 2, True),
        _version("m4", sealer.device_id, 4, False),
    ]
    assert answer["digest"] == _xor(hashes)


def test_buckets_list_and_prefixes(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    ids = [f"mem-{i:03d}-é" for i in range(300)]  # a non-ASCII id: SQL and Python agree
    for start in range(0, 300, 100):
        push_ok(http, vault, [sealer.blob(m, 1) for m in ids[start : start + 100]])
    assert all(r["digest_bucket"] == _bucket(r["memory_id"]) for r in _rows(relay, vault))
    top = _digest(http, vault)
    every = _digest(http, vault, buckets=1)
    assert (every["cursor"], every["count"], every["digest"]) == (300, 300, top["digest"])
    prefixes = base64.b64decode(every["buckets"])
    assert len(prefixes) == 256 * 8
    assert len(every["counts"]) == 256
    busiest = max(range(256), key=lambda b: every["counts"][b])
    for bucket in (busiest, _bucket(ids[0])):
        count, digest = _expected(relay, vault, bucket)
        one = _digest(http, vault, bucket=bucket)
        assert (one["bucket"], one["count"], one["digest"]) == (bucket, count, digest)
        assert every["counts"][bucket] == count
        assert prefixes[8 * bucket : 8 * bucket + 8] == base64.b64decode(digest)[:8]
        entries: list[list[Any]] = []
        after = ""
        while True:  # pages of 1: ordered by memory_id, has_more until the last
            page = _digest(http, vault, bucket=bucket, list=1, after=after, limit=1)
            entries += page["entries"]
            if not page["has_more"]:
                break
            after = page["entries"][-1][0]
        assert entries == sorted(
            [m, sealer.device_id, 1, False] for m in ids if _bucket(m) == bucket
        )
        assert len(entries) == count > 0
    empty = next(b for b in range(256) if every["counts"][b] == 0)
    assert _digest(http, vault, bucket=empty, list=1)["entries"] == []
    assert prefixes[8 * empty : 8 * empty + 8] == bytes(8)


def test_buckets_1_answers_the_stored_prefixes_and_counts(relay: Relay, http: httpx.Client) -> None:
    # PROTOCOL §18, revision 0012: `?buckets=1` reads the vault row (O(1)), it does not
    # compute over the rows: a value put straight into the row is what it answers.
    vault = new_vault_id()
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.blob(f"st-{i}", 1) for i in range(30)])
    computed = _digest(http, vault, buckets=1)
    assert sum(computed["counts"]) == 30  # the positive case: the pushes' own values
    planted = bytes(range(256)) * 8

    async def work(conn: asyncpg.Connection) -> None:
        await conn.execute(
            "UPDATE vaults SET bucket_prefixes = $2, bucket_counts = $3 WHERE vault_id = $1",
            vault,
            planted,
            b"".join(n.to_bytes(4, "big") for n in range(256)),
        )

    run_db(relay.database_url, work)
    answer = _digest(http, vault, buckets=1)
    assert base64.b64decode(answer["buckets"]) == planted
    assert answer["counts"] == list(range(256))
    assert answer["count"] == sum(range(256))
    assert (answer["cursor"], answer["digest"]) == (30, _digest(http, vault)["digest"])


def test_compaction_takes_erased_tombstones_out(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.blob(f"m{i}", 1) for i in range(5)])
    push_ok(http, vault, [sealer.blob("m1", 2, deleted=True), sealer.blob("m2", 2, deleted=True)])
    before = _digest(http, vault)

    async def work(conn: asyncpg.Connection) -> int:
        await conn.execute(
            "UPDATE blobs SET received_at = now() - interval '40 days' WHERE vault_id = $1", vault
        )
        await conn.execute(  # no device seen within the retention period is left to miss them
            "UPDATE devices SET last_seen = now() - interval '40 days' WHERE vault_id = $1", vault
        )
        return (await compact_vault(conn, vault, timedelta(days=30))).removed

    assert run_db(relay.database_url, work) == 2
    after = _digest(http, vault)
    count, digest = _expected(relay, vault)
    assert (after["count"], after["digest"]) == (count, digest) == (3, digest)
    assert after["digest"] != before["digest"]
    hashes = [_version(f"m{i}", sealer.device_id, 1, False) for i in (0, 3, 4)]
    assert after["digest"] == _xor(hashes)


def test_the_backfill_of_revision_0008_matches_the_pushes(relay: Relay, http: httpx.Client) -> None:
    spec = importlib.util.spec_from_file_location("migration_0008", MIGRATION)
    assert spec is not None
    assert spec.loader is not None
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    vault = new_vault_id()
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.blob(f"b{i}", i + 1, deleted=i % 3 == 0) for i in range(50)])
    kept = _digest(http, vault)["digest"]

    async def work(conn: asyncpg.Connection) -> bytes:
        await conn.execute("UPDATE vaults SET digest = $2 WHERE vault_id = $1", vault, bytes(32))
        await conn.execute(migration.UPGRADE[-1])
        digest: bytes = await conn.fetchval("SELECT digest FROM vaults WHERE vault_id = $1", vault)
        return digest

    assert base64.b64encode(run_db(relay.database_url, work)).decode() == kept


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"bucket": 256}, "bucket"),
        ({"bucket": -1}, "bucket"),
        ({"bucket": "x"}, "bucket"),
        ({"list": 1}, "list"),
        ({"list": 2, "bucket": 1}, "list"),
        ({"buckets": 1, "bucket": 3}, "buckets"),
        ({"after": "m1"}, "after"),
        ({"bucket": 1, "list": 1, "limit": 100_000}, "limit"),
    ],
)
def test_bad_parameters_are_400_json(
    http: httpx.Client, params: dict[str, Any], field: str
) -> None:
    response = http.get(f"/v1/vaults/{new_vault_id()}/digest", params=params)
    body = assert_error(response, 400)
    assert field in response.text, body


def test_digest_and_fetch_need_a_key_for_the_vault(relay: Relay) -> None:
    vault = new_vault_id()
    with client(relay, None) as anonymous:
        assert_error(anonymous.get(f"/v1/vaults/{vault}/digest"), 401)
        assert_error(anonymous.post(f"/v1/vaults/{vault}/fetch", json={"memory_ids": ["m"]}), 401)
    with client(relay, relay.mint(new_vault_id())) as elsewhere:
        assert_error(elsewhere.get(f"/v1/vaults/{vault}/digest"), 403)
        assert_error(elsewhere.post(f"/v1/vaults/{vault}/fetch", json={"memory_ids": ["m"]}), 403)


def test_fetch_gives_current_versions(http: httpx.Client) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.blob("a", 1), sealer.blob("b", 1)])
    newer = sealer.blob("a", 7)
    push_ok(http, vault, [newer])
    response = http.post(f"/v1/vaults/{vault}/fetch", json={"memory_ids": ["a", "zz", "a"]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["has_more"] is False
    assert [(b["memory_id"], b["vector_clock"], b["ciphertext"]) for b in body["blobs"]] == [
        ("a", 7, newer.ciphertext)
    ]
    for payload, field in (
        ({"memory_ids": []}, "memory_ids"),
        ({"memory_ids": [f"m{i}" for i in range(1001)]}, "memory_ids"),
        ({"memory_ids": [""]}, "memory_ids"),
        ({"memory_ids": "a"}, "memory_ids"),
    ):
        bad = http.post(f"/v1/vaults/{vault}/fetch", json=payload)
        assert_error(bad, 400)
        assert field in bad.text


# --- POST /v1/vaults/{v}/digest/narrow (ours, docs/digest.md) ------------------------------


def _sub(memory_id: str) -> int:
    return hashlib.sha256(memory_id.encode()).digest()[1]


def _sub_prefixes(versions: list[tuple[str, str, int, bool]]) -> str:
    """The device side of a narrow request, computed here with hashlib: the first 8 bytes
    of each of the 256 sub-bucket digests of `versions` (one bucket's)."""
    subs: dict[int, list[bytes]] = {}
    for m, d, c, deleted in versions:
        subs.setdefault(_sub(m), []).append(_version(m, d, c, deleted))
    return base64.b64encode(
        b"".join(base64.b64decode(_xor(subs.get(s, [])))[:8] for s in range(256))
    ).decode()


def _narrow(http: httpx.Client, vault: str, **body: Any) -> dict[str, Any]:
    response = http.post(f"/v1/vaults/{vault}/digest/narrow", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _busy_bucket(http: httpx.Client, vault: str) -> int:
    counts = _digest(http, vault, buckets=1)["counts"]
    return max(range(256), key=lambda b: counts[b])


def test_narrow_lists_only_the_sub_buckets_that_differ(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    ids = [f"nar-{i:04d}-é" for i in range(600)]
    for start in range(0, 600, 200):
        push_ok(http, vault, [sealer.blob(m, 1) for m in ids[start : start + 200]])
    push_ok(http, vault, [sealer.blob(ids[7], 2, deleted=True)])
    bucket = _busy_bucket(http, vault)
    relay_side = sorted(
        (r["memory_id"], r["device_id"], r["vector_clock"], r["deleted"])
        for r in _rows(relay, vault)
        if _bucket(r["memory_id"]) == bucket
    )
    assert len(relay_side) >= 3
    count, digest = _expected(relay, vault, bucket)

    agreeing = _narrow(http, vault, bucket=bucket, subs=_sub_prefixes(relay_side))
    assert agreeing == {
        "cursor": 601,
        "count": count,
        "digest": digest,
        "bucket": bucket,
        "subs": [],
        "entries": [],
        "has_more": False,
    }
    # the device lacks one version and holds another at an older clock
    lacking, older = relay_side[0], relay_side[-1]
    device = [v for v in relay_side if v not in (lacking, older)]
    device.append((older[0], older[1], older[2] - 1 if older[2] > 1 else 9, older[3]))
    answer = _narrow(http, vault, bucket=bucket, subs=_sub_prefixes(device))
    differ = sorted({_sub(lacking[0]), _sub(older[0])})
    assert answer["subs"] == differ
    assert answer["entries"] == [list(v) for v in relay_side if _sub(v[0]) in differ]
    assert (answer["count"], answer["digest"], answer["has_more"]) == (count, digest, False)
    after = answer["entries"][0][0]
    rest = _narrow(http, vault, bucket=bucket, subs=_sub_prefixes(device), after=after)
    assert rest["entries"] == answer["entries"][1:]
    # every sub-bucket differs from an all-zero device (empty sub-buckets are zero too)
    everything = _narrow(http, vault, bucket=bucket, subs=base64.b64encode(bytes(2048)).decode())
    assert everything["subs"] == sorted({_sub(v[0]) for v in relay_side})
    assert everything["entries"] == [list(v) for v in relay_side]


def test_narrow_pages_by_memory_id(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    ids = [f"page-{i:03d}" for i in range(300)]
    push_ok(http, vault, [sealer.blob(m, 1) for m in ids])
    bucket = _busy_bucket(http, vault)
    zero = bytes(2048)

    async def work(conn: asyncpg.Connection) -> list[list[str]]:
        pages: list[list[str]] = []
        after = ""
        pool = cast("asyncpg.Pool", conn)  # store.narrow asks for one fetch
        while True:
            page = await narrow(pool, vault, bucket, zero, after, 1)
            pages.append([v.memory_id for v in page.versions])
            if not page.has_more:
                return pages
            after = page.versions[-1].memory_id

    pages = run_db(relay.database_url, work)
    # A page of one memory each: the busiest bucket of these 300 ids holds 4, so 4 pages
    # (with pages of 2 it was 2 pages, and `> 2` could not hold).
    assert len(pages) > 2
    assert all(len(p) == 1 for p in pages)
    assert [m for p in pages for m in p] == sorted(m for m in ids if _bucket(m) == bucket)


def test_narrow_of_an_unknown_vault_holds_nothing(http: httpx.Client) -> None:
    prefixes = bytearray(2048)
    prefixes[8 * 5] = 1
    answer = _narrow(http, new_vault_id(), bucket=3, subs=base64.b64encode(prefixes).decode())
    assert (answer["count"], answer["subs"], answer["entries"]) == (0, [5], [])
    zero = _narrow(http, new_vault_id(), bucket=3, subs=base64.b64encode(bytes(2048)).decode())
    assert zero["subs"] == []


_GOOD_SUBS = base64.b64encode(bytes(2048)).decode()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"bucket": 256, "subs": _GOOD_SUBS}, "bucket"),
        ({"bucket": -1, "subs": _GOOD_SUBS}, "bucket"),
        ({"bucket": "1", "subs": _GOOD_SUBS}, "bucket"),
        ({"subs": _GOOD_SUBS}, "bucket"),
        ({"bucket": 1}, "subs"),
        ({"bucket": 1, "subs": base64.b64encode(bytes(2040)).decode()}, "subs"),  # 255 digests
        ({"bucket": 1, "subs": base64.b64encode(bytes(2056)).decode()}, "subs"),  # 257
        ({"bucket": 1, "subs": "!" * 2732}, "subs"),
        ({"bucket": 1, "subs": base64.b64encode(bytes(4096)).decode()}, "subs"),
        ({"bucket": 1, "subs": _GOOD_SUBS, "after": "m" * 300}, "after"),
        ({"bucket": 1, "subs": _GOOD_SUBS, "after": 7}, "after"),
    ],
)
def test_bad_narrow_requests_are_400_json(
    http: httpx.Client, body: dict[str, Any], field: str
) -> None:
    response = http.post(f"/v1/vaults/{new_vault_id()}/digest/narrow", json=body)
    answer = assert_error(response, 400)
    assert answer.get("field") == field or field in answer["error"], answer


def test_narrow_bodies_are_capped_and_need_a_key(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id()
    padded = {"bucket": 1, "subs": _GOOD_SUBS, "padding": "x" * 20_000}
    assert_error(http.post(f"/v1/vaults/{vault}/digest/narrow", json=padded), 413)
    ok = http.post(f"/v1/vaults/{vault}/digest/narrow", json={"bucket": 1, "subs": _GOOD_SUBS})
    assert ok.status_code == 200, ok.text  # the positive case beside the cap
    body = {"bucket": 1, "subs": _GOOD_SUBS}
    with client(relay, None) as anonymous:
        assert_error(anonymous.post(f"/v1/vaults/{vault}/digest/narrow", json=body), 401)
    with client(relay, relay.mint(new_vault_id())) as elsewhere:
        assert_error(elsewhere.post(f"/v1/vaults/{vault}/digest/narrow", json=body), 403)


def test_blobs_hold_no_bucket(relay: Relay) -> None:
    """Revision 0014: no bucket column, no bucket index, the key (vault_id, memory_id):
    the push writes nothing for the buckets but the vault row's prefixes and counts."""

    async def work(conn: asyncpg.Connection) -> tuple[set[str], str, list[str]]:
        columns = await conn.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'blobs'"
        )
        key = await conn.fetchval("SELECT indexdef FROM pg_indexes WHERE indexname = 'blobs_pkey'")
        indexes = await conn.fetch("SELECT indexdef FROM pg_indexes WHERE tablename = 'blobs'")
        return {r["column_name"] for r in columns}, key, [r["indexdef"] for r in indexes]

    columns, key, indexes = run_db(relay.database_url, work)
    assert "memory_id" in columns
    assert "digest_bucket" not in columns
    assert key.endswith("(vault_id, memory_id)"), key
    assert indexes
    assert not any("bucket" in index for index in indexes), indexes
