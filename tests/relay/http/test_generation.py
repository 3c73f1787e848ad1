"""The relay generation (PROTOCOL §17) and the cursor-mode `head` and per-blob `seq` (§9).

Real HTTP against real PostgreSQL. The restore that replaces the generation is driven
in tests/deploy/test_backup_restore.py.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg
import httpx
import msgspec

from engram_sync.relay.db.migrate import upgrade_to_head
from engram_sync.relay.db.url import to_libpq_url
from engram_sync.shared_format import SyncBlob
from tests.relay.conftest import ADMIN_KEY, Relay, base_config
from tests.relay.support import (
    Sealer,
    client,
    generation,
    migrated_database,
    module_relay_fixture,
    new_vault_id,
    pull_ok,
    push_ok,
    serve,
    wire,
)

HEX32 = re.compile(r"[0-9a-f]{32}")


relay = module_relay_fixture()


def stored_generation(relay: Relay) -> str:
    rows = relay.sql("SELECT generation FROM relay_meta")
    assert len(rows) == 1
    value: str = rows[0]["generation"]
    return value


def vault_seq(relay: Relay, vault_id: str) -> int:
    rows = relay.sql("SELECT seq FROM vaults WHERE vault_id = $1", vault_id)
    return int(rows[0]["seq"]) if rows else 0


# --- the generation in every answer ------------------------------------------------------


def test_info_push_and_pull_carry_the_databases_generation(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    with httpx.Client(base_url=relay.url) as anonymous:  # /v1/info needs no key
        info = anonymous.get("/v1/info").json()
    assert "generation" in info["features"]
    current = info["generation"]
    assert HEX32.fullmatch(current)
    assert current == stored_generation(relay)

    sealer = Sealer(vault)
    pushed = push_ok(http, vault, sealer.blobs(3))
    stale = push_ok(http, vault, [sealer.blob("mem-0000", 1)])  # rejected, still answered
    assert stale["rejected"] == ["mem-0000"]
    by_cursor = pull_ok(http, vault, cursor=0)
    empty = pull_ok(http, vault, cursor=by_cursor["cursor"])
    legacy = pull_ok(http, vault)
    by_since = pull_ok(http, vault, since="2000-01-01T00:00:00Z")
    answers = [pushed, stale, by_cursor, empty, legacy, by_since]
    assert [a["generation"] for a in answers] == [current] * len(answers)


def test_the_generation_is_answered_from_memory_not_per_request(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    """With relay_meta locked against every reader, info, push and pull still answer:
    none of them reads the generation from the database."""
    current = generation(http)
    sealer = Sealer(vault)
    quick = httpx.Client(
        base_url=relay.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=5
    )
    with locked_relay_meta(relay.database_url), quick:
        assert quick.get("/v1/info").json()["generation"] == current
        assert push_ok(quick, vault, sealer.blobs(2))["generation"] == current
        assert pull_ok(quick, vault, cursor=0)["generation"] == current
        assert pull_ok(quick, vault)["generation"] == current


@contextmanager
def locked_relay_meta(database_url: str) -> Iterator[None]:
    """Hold an ACCESS EXCLUSIVE lock on relay_meta (blocks even plain SELECTs) meanwhile."""
    locked = threading.Event()
    release = threading.Event()
    errors: list[BaseException] = []

    async def hold() -> None:
        conn = await asyncpg.connect(to_libpq_url(database_url))
        try:
            async with conn.transaction():
                await conn.execute("LOCK TABLE relay_meta IN ACCESS EXCLUSIVE MODE")
                locked.set()
                await asyncio.to_thread(release.wait)
        finally:
            await conn.close()

    def run() -> None:
        try:
            asyncio.run(hold())
        except BaseException as exc:
            errors.append(exc)
            locked.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert locked.wait(timeout=30)
    assert errors == []
    try:
        yield
    finally:
        release.set()
        thread.join(timeout=30)
    assert errors == []


def test_a_new_generation_reaches_a_running_relay_with_the_health_refresh(
    fresh_database_url: str,
) -> None:
    """What `engram-relay restore` writes, a running replica picks up within one refresh
    period (0.2 s in the tests) — in info, push and pull alike."""
    with serve(base_config(fresh_database_url)) as relay, client(relay) as http:
        before = generation(http)
        replaced = "0123456789abcdef" * 2
        relay.sql("UPDATE relay_meta SET generation = $1", replaced)
        deadline = time.monotonic() + 10
        while generation(http) == before:
            assert time.monotonic() < deadline, "the relay never saw the new generation"
            time.sleep(0.05)
        assert generation(http) == replaced
        vault = new_vault_id()
        assert push_ok(http, vault, Sealer(vault).blobs(1))["generation"] == replaced
        assert pull_ok(http, vault, cursor=0)["generation"] == replaced
        assert pull_ok(http, vault)["generation"] == replaced


def test_the_generation_is_stable_across_restarts_and_replicas(postgres_url: str) -> None:
    with migrated_database(postgres_url) as url:
        config = base_config(url)
        with serve(config) as first, client(first) as http:
            before = generation(http)
            vault = new_vault_id()
            push_ok(http, vault, Sealer(vault).blobs(2))
        # A restart (and a migration run again, as `engram-relay serve` does) keeps it,
        # and two replicas on one database answer the same...
        upgrade_to_head(url)
        with (
            serve(config) as second,
            serve(config) as replica,
            client(second) as a,
            client(replica) as b,
        ):
            assert generation(a) == generation(b) == before
            assert pull_ok(a, vault, cursor=0)["generation"] == before
    # ...while another database has its own.
    with (
        migrated_database(postgres_url) as other,
        serve(base_config(other)) as elsewhere,
        client(elsewhere) as http,
    ):
        assert generation(http) != before


# --- cursor mode: per-blob seq and the vault's head ----------------------------------------


def test_cursor_pages_carry_each_blobs_seq_and_the_vaults_head(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.blob(m, 1) for m in "abcd"])
    push_ok(http, vault, [sealer.blob("e", 1), sealer.blob("a", 2)])  # "a" moves to seq 6
    head = vault_seq(relay, vault)
    assert head == 6
    cursor, seen = 0, []
    while True:
        page = pull_ok(http, vault, cursor=cursor, limit=2)
        seqs = [b["seq"] for b in page["blobs"]]
        assert seqs == sorted(set(seqs))  # strictly increasing
        assert all(s > cursor for s in seqs)
        assert page["cursor"] == seqs[-1]
        assert page["head"] == head  # the vault's, not the page's
        seen += [(b["memory_id"], b["seq"]) for b in page["blobs"]]
        cursor = page["cursor"]
        if not page["has_more"]:
            break
    db = relay.sql("SELECT memory_id, seq FROM blobs WHERE vault_id = $1 ORDER BY seq", vault)
    assert seen == [(r["memory_id"], r["seq"]) for r in db]
    assert seen == [("b", 2), ("c", 3), ("d", 4), ("e", 5), ("a", 6)]
    # Nothing beyond the head: the cursor stays, the head is still the vault's.
    tail = pull_ok(http, vault, cursor=6)
    assert (tail["blobs"], tail["cursor"], tail["head"]) == ([], 6, 6)


def test_a_head_below_the_cursor_is_reported_as_it_is(http: httpx.Client, vault: str) -> None:
    """A device whose cursor is past the vault's sequence (a restored relay, §17) must see
    the lower head: the relay never raises it to the cursor it was given."""
    push_ok(http, vault, Sealer(vault).blobs(3))
    page = pull_ok(http, vault, cursor=50)
    assert (page["blobs"], page["cursor"], page["head"]) == ([], 50, 3)


def test_an_unknown_vault_has_head_zero(http: httpx.Client) -> None:
    page = pull_ok(http, new_vault_id("nobody"), cursor=0)
    assert (page["blobs"], page["cursor"], page["head"]) == ([], 0, 0)
    assert pull_ok(http, new_vault_id("nobody"), cursor=7)["head"] == 0


def test_legacy_since_answers_carry_no_seq_cursor_or_head(http: httpx.Client, vault: str) -> None:
    push_ok(http, vault, Sealer(vault).blobs(3))
    for params in ({}, {"since": "2000-01-01T00:00:00+00:00"}, {"since": ""}):
        page = pull_ok(http, vault, **params)
        assert len(page["blobs"]) == 3
        assert set(page) == {"blobs", "has_more", "generation"}
        assert all("seq" not in b for b in page["blobs"])


def test_a_pulled_blob_with_its_seq_still_verifies_and_decrypts(
    http: httpx.Client, vault: str
) -> None:
    """`seq` is outside the HMAC of §3: a reader decoding the whole pulled object (seq
    included) verifies and opens it with the vault keys."""
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.blob("m", 4)])
    (pulled,) = pull_ok(http, vault, cursor=0)["blobs"]
    blob = msgspec.convert(pulled, SyncBlob)
    assert blob.seq == 1
    assert "memory m v4" in sealer.cipher.open(blob)


def test_a_pushed_seq_is_accepted_and_ignored(relay: Relay, http: httpx.Client, vault: str) -> None:
    """A device re-pushing blobs it once pulled (§17) may send their old `seq`: the relay
    numbers them itself."""
    sealer = Sealer(vault)
    first = {**wire(sealer.blob("m1", 1)), "seq": 999}
    second = {**wire(sealer.blob("m2", 1)), "seq": 1}
    answer = push_ok(http, vault, [first, second])
    assert (answer["accepted"], answer["rejected"], answer["cursor"]) == (2, [], 2)
    rows = relay.sql("SELECT memory_id, seq FROM blobs WHERE vault_id = $1 ORDER BY seq", vault)
    assert [(r["memory_id"], r["seq"]) for r in rows] == [("m1", 1), ("m2", 2)]
    assert vault_seq(relay, vault) == 2
    pulled = pull_ok(http, vault, cursor=0)["blobs"]
    assert [(b["memory_id"], b["seq"]) for b in pulled] == [("m1", 1), ("m2", 2)]
    assert [{k: v for k, v in b.items() if k != "seq"} for b in pulled] == [
        {k: v for k, v in b.items() if k != "seq"} for b in (first, second)
    ]
