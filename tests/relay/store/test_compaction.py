"""Tombstone compaction (PROTOCOL §9, §12) with devices identified over real HTTP.

Age is simulated honestly in the database: tombstones' `received_at` and a lagging
device's `last_seen` are moved 40 days back; compaction runs with asyncpg directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import asyncpg
import httpx
import pytest

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.domain.domain_errors import ResyncRequiredError
from engram_sync.relay.store.compaction import CompactionResult, compact_all, compact_vault
from engram_sync.relay.store.sync import Page, pull_by_cursor
from tests.relay.conftest import Relay
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    module_relay_fixture,
    new_device_id,
    new_vault_id,
    pull,
    pull_all,
    pull_ok,
    push_ok,
    run_db,
    versions,
)

#: The same tests on the Citus cluster too, by default (issue 18, tests/conftest.py).
pytestmark = pytest.mark.both_databases

RETENTION = timedelta(days=30)


relay = module_relay_fixture()


@dataclass
class Device:
    """A device pulling over HTTP, identified by a bound key or by X-Engram-Device."""

    device_id: str
    http: httpx.Client
    header: bool

    def pull(
        self, vault: str, cursor: int, limit: int | None = None, origin: int | None = None
    ) -> httpx.Response:
        headers = {"X-Engram-Device": self.device_id} if self.header else {}
        params: dict[str, Any] = {"cursor": cursor}
        if limit is not None:
            params["limit"] = limit
        if origin is not None:
            params["origin"] = origin
        return self.http.get(f"/v1/vaults/{vault}/pull", params=params, headers=headers)

    def catch_up(self, vault: str, cursor: int = 0) -> int:
        while True:
            response = self.pull(vault, cursor)
            assert response.status_code == 200, response.text
            page = response.json()
            cursor = page["cursor"]
            if not page["has_more"]:
                return cursor


@dataclass
class Scenario:
    vault: str
    sealer: Sealer
    a: Device  # device-bound key (the pusher)
    b: Device  # operator key + X-Engram-Device
    c: Device  # operator key + X-Engram-Device; lags behind


@pytest.fixture
def scenario(relay: Relay) -> Iterator[Scenario]:
    """m1..m4 live (seq 1-4), everyone pulls; tombstones m1, m2 (seq 5, 6), m5 live (seq 7);
    A and B pull to 7, C stays at 4."""
    vault = new_vault_id()
    sealer = Sealer(vault)
    with (
        client(relay, relay.mint(vault, device_id=sealer.device_id)) as a_http,
        client(relay) as b_http,
        client(relay) as c_http,
    ):
        s = Scenario(
            vault,
            sealer,
            Device(sealer.device_id, a_http, header=False),
            Device(new_device_id(), b_http, header=True),
            Device(new_device_id(), c_http, header=True),
        )
        push_ok(a_http, vault, [sealer.blob(f"m{i}", 1) for i in range(1, 5)])
        for device in (s.a, s.b, s.c):
            assert device.catch_up(vault) == 4
        push_ok(
            a_http,
            vault,
            [sealer.blob("m1", 2, deleted=True), sealer.blob("m2", 2, deleted=True)],
        )
        push_ok(a_http, vault, [sealer.blob("m5", 1)])
        assert s.a.catch_up(vault, 4) == 7
        assert s.b.catch_up(vault, 4) == 7
        yield s


def compact(relay: Relay, vault: str) -> CompactionResult:
    async def work(conn: asyncpg.Connection) -> CompactionResult:
        return await compact_vault(conn, vault, RETENTION)

    return run_db(relay.database_url, work)


def pulled_cursors(relay: Relay, vault: str) -> dict[str, int]:
    rows = relay.sql("SELECT device_id, pulled_cursor FROM devices WHERE vault_id = $1", vault)
    return {r["device_id"]: r["pulled_cursor"] for r in rows}


def age_tombstones(relay: Relay, vault: str) -> None:
    relay.sql(
        "UPDATE blobs SET received_at = now() - interval '40 days' WHERE vault_id = $1 AND deleted",
        vault,
    )


def age_device(relay: Relay, vault: str, device_id: str) -> None:
    relay.sql(
        "UPDATE devices SET last_seen = now() - interval '40 days'"
        " WHERE vault_id = $1 AND device_id = $2",
        vault,
        device_id,
    )


def tombstones(relay: Relay, vault: str) -> list[str]:
    rows = relay.sql(
        "SELECT memory_id FROM blobs WHERE vault_id = $1 AND deleted ORDER BY memory_id", vault
    )
    return [r["memory_id"] for r in rows]


def test_pull_progress_is_recorded_per_device(relay: Relay, scenario: Scenario) -> None:
    s = scenario
    assert pulled_cursors(relay, s.vault) == {s.a.device_id: 7, s.b.device_id: 7, s.c.device_id: 4}
    # Progress never goes backwards (a re-pull from 0 keeps the high-water mark).
    assert s.b.pull(s.vault, 0, limit=1).status_code == 200
    assert pulled_cursors(relay, s.vault)[s.b.device_id] == 7


def test_young_tombstones_are_kept(relay: Relay, scenario: Scenario) -> None:
    s = scenario
    assert s.c.catch_up(s.vault, 4) == 7
    assert compact(relay, s.vault).removed == 0
    assert tombstones(relay, s.vault) == ["m1", "m2"]


def test_an_active_lagging_device_blocks_compaction(relay: Relay, scenario: Scenario) -> None:
    s = scenario
    age_tombstones(relay, s.vault)
    result = compact(relay, s.vault)
    assert (result.removed, result.horizon) == (0, 0)
    assert tombstones(relay, s.vault) == ["m1", "m2"]
    counts = "SELECT live_blobs, tombstones FROM vaults WHERE vault_id = $1"
    assert [tuple(r) for r in relay.sql(counts, s.vault)] == [(3, 2)]  # m3 m4 m5; m1 m2
    # Once C has pulled past them they go, live blobs stay (however old).
    relay.sql(
        "UPDATE blobs SET received_at = now() - interval '400 days' WHERE vault_id = $1", s.vault
    )
    assert s.c.catch_up(s.vault, 4) == 7
    result = compact(relay, s.vault)
    assert (result.vault_id, result.removed, result.horizon) == (s.vault, 2, 6)
    assert tombstones(relay, s.vault) == []
    live, cursor = pull_all(s.a.http, s.vault)
    assert versions(live) == [("m3", 1), ("m4", 1), ("m5", 1)]
    assert cursor == 7
    (row,) = relay.sql(
        "SELECT v.bytes_used, v.compacted_through, (SELECT sum(size_bytes) FROM blobs b"
        " WHERE b.vault_id = v.vault_id) AS actual FROM vaults v WHERE v.vault_id = $1",
        s.vault,
    )
    assert row["bytes_used"] == row["actual"]
    assert row["compacted_through"] == 6
    assert [tuple(r) for r in relay.sql(counts, s.vault)] == [(3, 0)]  # the counts follow
    # Idempotent: nothing more to remove, the horizon stays.
    assert compact(relay, s.vault) == CompactionResult(s.vault, 0, 6)
    # Cursors at or past the horizon keep working, a cursor below it does not.
    for cursor in (6, 7):
        assert s.b.pull(s.vault, cursor).status_code == 200
    assert_error(s.b.pull(s.vault, 5), 409, "resync_required")


def test_a_stale_lagging_device_must_resync(relay: Relay, scenario: Scenario) -> None:
    s = scenario
    age_tombstones(relay, s.vault)
    age_device(relay, s.vault, s.c.device_id)
    result = compact(relay, s.vault)
    assert (result.removed, result.horizon) == (2, 6)
    # C, with its old cursor, is told to resync instead of silently missing the deletions.
    body = assert_error(s.c.pull(s.vault, 4), 409, "resync_required")
    assert body["horizon"] == 6
    assert "cursor 0" in body["error"]
    # The others are not affected.
    assert s.a.pull(s.vault, 7).json() == {
        "blobs": [],
        "has_more": False,
        "cursor": 7,
        "generation": relay.sql("SELECT generation FROM relay_meta")[0]["generation"],
        "head": 7,  # compaction removes rows, never lowers the vault's sequence (§17)
    }
    assert s.b.pull(s.vault, 7).status_code == 200
    # A full re-pull from cursor 0 works and brings C up to date.
    response = s.c.pull(s.vault, 0)
    assert response.status_code == 200
    page = response.json()
    assert versions(page["blobs"]) == [("m3", 1), ("m4", 1), ("m5", 1)]
    assert (page["has_more"], page["cursor"]) == (False, 7)
    assert pulled_cursors(relay, s.vault)[s.c.device_id] == 7
    assert s.c.pull(s.vault, 7).status_code == 200
    # A legacy (since) pull has no cursor and is never refused.
    assert len(pull_ok(s.c.http, s.vault)["blobs"]) == 3
    # docs/pull-origin.md: a pull that began at 0 continues below the horizon page by page;
    # an origin behind the horizon but above 0 is as stale as the cursor itself.
    first = s.c.pull(s.vault, 0, limit=1).json()
    assert first["cursor"] < 6
    assert assert_error(s.c.pull(s.vault, first["cursor"], limit=1), 409, "resync_required")
    assert s.c.pull(s.vault, first["cursor"], limit=1, origin=0).status_code == 200
    assert_error(s.c.pull(s.vault, 7, origin=4), 409, "resync_required")


def test_a_revoked_device_does_not_block(relay: Relay, scenario: Scenario) -> None:
    s = scenario
    age_tombstones(relay, s.vault)
    assert compact(relay, s.vault).removed == 0
    assert s.a.http.delete(f"/v1/vaults/{s.vault}/devices/{s.c.device_id}").status_code == 403
    with client(relay) as admin:
        assert admin.delete(f"/v1/vaults/{s.vault}/devices/{s.c.device_id}").status_code == 200
    assert compact(relay, s.vault).removed == 2


def test_only_tombstones_past_every_device_go(relay: Relay, scenario: Scenario) -> None:
    s = scenario
    # C pulls only up to the first tombstone (seq 5).
    assert s.c.pull(s.vault, 4, limit=1).json()["cursor"] == 5
    age_tombstones(relay, s.vault)
    result = compact(relay, s.vault)
    assert (result.removed, result.horizon) == (1, 5)
    assert tombstones(relay, s.vault) == ["m2"]
    assert s.c.pull(s.vault, 5).status_code == 200


def test_a_registered_device_that_never_pulled_blocks(relay: Relay, scenario: Scenario) -> None:
    s = scenario
    assert s.c.catch_up(s.vault, 4) == 7
    with client(relay) as admin:
        registered = admin.post(
            f"/v1/vaults/{s.vault}/devices/register",
            json={"device_id": new_device_id(), "label": "new phone"},
        )
    assert registered.status_code == 200
    age_tombstones(relay, s.vault)
    assert compact(relay, s.vault).removed == 0


def test_a_header_never_records_progress_for_a_bound_device(
    relay: Relay, scenario: Scenario
) -> None:
    """Issue 31 finding 9 (PROTOCOL §12, docs/pull-progress.md): any member key pulling at
    the head with `X-Engram-Device` naming another, offline device bound to its own key
    must not mark that device caught up, or compaction drops a tombstone it never pulled
    and its next sync pushes the deleted memory back."""
    s = scenario
    d_id = new_device_id()
    d = Device(d_id, client(relay, relay.mint(s.vault, device_id=d_id)), header=False)
    with d.http:
        assert d.pull(s.vault, 0, limit=2).json()["cursor"] == 4  # m3, m4; D goes offline
    assert s.c.catch_up(s.vault, 4) == 7
    with client(relay, relay.mint(s.vault)) as member:  # an unbound member key
        named = member.get(
            f"/v1/vaults/{s.vault}/pull",
            params={"cursor": 7},
            headers={"X-Engram-Device": d.device_id},
        )
        assert named.status_code == 200, named.text  # the pull itself is answered
    # A bound key speaks for its own device only, whatever its header names.
    bound = s.a.http.get(
        f"/v1/vaults/{s.vault}/pull",
        params={"cursor": 7},
        headers={"X-Engram-Device": d.device_id},
    )
    assert bound.status_code == 200, bound.text
    assert pulled_cursors(relay, s.vault)[d.device_id] == 4
    age_tombstones(relay, s.vault)
    assert compact(relay, s.vault).removed == 0
    assert tombstones(relay, s.vault) == ["m1", "m2"]
    # Next to it, the honest cases: D's own pull, and an unbound device's header (C).
    with client(relay, relay.mint(s.vault, device_id=d.device_id)) as own:
        assert Device(d.device_id, own, header=False).catch_up(s.vault, 4) == 7
    assert pulled_cursors(relay, s.vault)[s.c.device_id] == 7
    assert compact(relay, s.vault).removed == 2


def test_compact_all_covers_every_vault(relay: Relay) -> None:
    vaults = [new_vault_id("all") for _ in range(3)]
    with client(relay) as http:
        for i, vault in enumerate(vaults):
            sealer = Sealer(vault)
            push_ok(http, vault, [sealer.blob("keep", 1), sealer.blob("gone", 1)])
            if i < 2:
                push_ok(http, vault, [sealer.blob("gone", 2, deleted=True)])
    for vault in vaults:
        age_tombstones(relay, vault)
        # The pusher never reported pull progress: only its absence for 40 days lets go.
        relay.sql(
            "UPDATE devices SET last_seen = now() - interval '40 days' WHERE vault_id = $1", vault
        )

    async def work(conn: asyncpg.Connection) -> list[CompactionResult]:
        pool = await asyncpg.create_pool(to_libpq_url(relay.database_url), min_size=1, max_size=2)
        try:
            return await compact_all(pool, RETENTION)
        finally:
            await pool.close()

    results = {r.vault_id: r for r in run_db(relay.database_url, work)}
    assert results[vaults[0]] == CompactionResult(vaults[0], 1, 3)
    assert results[vaults[1]] == CompactionResult(vaults[1], 1, 3)
    assert vaults[2] not in results  # no tombstones, nothing to do
    with client(relay) as http:
        for vault in vaults[:2]:
            assert_error(pull(http, vault, cursor=1), 409, "resync_required")
            assert [b["memory_id"] for b in pull_ok(http, vault, cursor=0)["blobs"]] == ["keep"]
        assert pull(http, vaults[2], cursor=1).status_code == 200


def _compacted_vault(relay: Relay, *, keep: bool) -> tuple[str, Device]:
    """m1 (if `keep`), m2, m3 live, then m2 and m3 deleted: the vault's newest entries are
    tombstones, compacted (every device aged out). Returns the vault and a new device."""
    vault = new_vault_id("top")
    sealer = Sealer(vault)
    with client(relay) as http:
        live = ["m1", "m2", "m3"] if keep else ["m2", "m3"]
        push_ok(http, vault, [sealer.blob(m, 1) for m in live])
        push_ok(http, vault, [sealer.blob(m, 2, deleted=True) for m in ("m2", "m3")])
    age_tombstones(relay, vault)
    relay.sql(
        "UPDATE devices SET last_seen = now() - interval '40 days' WHERE vault_id = $1", vault
    )
    head = len(live) + 2
    assert compact(relay, vault) == CompactionResult(vault, 2, head)
    return vault, Device(new_device_id(), client(relay), header=True)


@pytest.mark.parametrize("limit", [None, 1])
def test_a_last_page_ends_at_the_compaction_horizon(relay: Relay, limit: int | None) -> None:
    """Issue 14 item 9 (PROTOCOL §9, §12): with compacted tombstones above the last live
    blob, the page that reaches the end answers the head, not the last blob's seq, so the
    next sync is an ordinary empty pull instead of `resync_required` forever."""
    vault, device = _compacted_vault(relay, keep=True)
    with device.http:
        response = device.pull(vault, 0, limit=limit)
        assert response.status_code == 200, response.text
        page = response.json()
        assert versions(page["blobs"]) == [("m1", 1)]
        assert (page["has_more"], page["cursor"], page["head"]) == (False, 5, 5)
        again = device.pull(vault, page["cursor"])
        assert again.status_code == 200, again.text
        assert (again.json()["blobs"], again.json()["cursor"]) == ([], 5)
    assert pulled_cursors(relay, vault)[device.device_id] == 5


def test_a_vault_whose_every_entry_was_compacted(relay: Relay) -> None:
    """A device at cursor 0 of a vault holding nothing but compacted tombstones is told
    the head, with no blob (the client accepts exactly that on a last page)."""
    vault, device = _compacted_vault(relay, keep=False)
    with device.http:
        page = device.pull(vault, 0).json()
        assert (page["blobs"], page["has_more"], page["cursor"], page["head"]) == (
            [],
            False,
            4,
            4,
        )
        assert device.pull(vault, 4).status_code == 200


class _Statements:
    """A pool whose one connection runs `between` once, before the pull's statement
    number `at` (counting from 0) or, if the pull issues fewer, after it: a compaction
    committing at that exact point, driven step by step (no sleeps)."""

    def __init__(self, conn: asyncpg.Connection, at: int, between: Any) -> None:
        self.conn, self.at, self.between = conn, at, between
        self.issued = 0
        self.ran = False

    async def _step(self) -> None:
        if self.issued == self.at and not self.ran:
            self.ran = True
            await self.between()
        self.issued += 1

    async def fetch(self, *args: Any) -> Any:
        await self._step()
        return await self.conn.fetch(*args)

    async def fetchrow(self, *args: Any) -> Any:
        await self._step()
        return await self.conn.fetchrow(*args)

    async def fetchval(self, *args: Any) -> Any:
        await self._step()
        return await self.conn.fetchval(*args)

    async def execute(self, *args: Any) -> Any:
        await self._step()
        return await self.conn.execute(*args)

    def acquire(self) -> Any:
        outer = self

        class _Borrow:
            async def __aenter__(self) -> _Statements:
                return outer

            async def __aexit__(self, *exc: object) -> None:
                return None

        return _Borrow()


@pytest.mark.parametrize("at", [1, 2])
def test_a_compaction_committing_during_a_pull(relay: Relay, at: int) -> None:
    """Issue 14 item 10 (PROTOCOL §12): a device at cursor 3 pulls while the tombstones of
    m2 and m3 (seq 4, 5) are compacted between two statements of the pull. It must either
    get the tombstones or `resync_required`, never a page that says nothing is left."""
    vault = new_vault_id("race")
    sealer = Sealer(vault)
    device = new_device_id()
    with client(relay) as http:
        push_ok(http, vault, [sealer.blob(m, 1) for m in ("m1", "m2", "m3")])
        assert pull_ok(http, vault, cursor=0)["cursor"] == 3
        push_ok(http, vault, [sealer.blob(m, 2, deleted=True) for m in ("m2", "m3")])
    age_tombstones(relay, vault)
    relay.sql(
        "UPDATE devices SET last_seen = now() - interval '40 days' WHERE vault_id = $1", vault
    )
    results: list[CompactionResult] = []

    async def work(conn: asyncpg.Connection) -> Page | str:
        other = await asyncpg.connect(to_libpq_url(relay.database_url))

        async def between() -> None:
            results.append(await compact_vault(other, vault, RETENTION))

        pool = _Statements(conn, at, between)
        try:
            page = await pull_by_cursor(
                cast(asyncpg.Pool, pool), vault, 3, 1000, device, max_bytes=2**20
            )
        except ResyncRequiredError as exc:
            assert (exc.cursor, exc.horizon) == (3, 5)
            return "resync_required"
        finally:
            if not pool.ran:
                await between()
            await other.close()
        return page

    answer = run_db(relay.database_url, work)
    assert results == [CompactionResult(vault, 2, 5)]  # the compaction did run meanwhile
    if isinstance(answer, str):
        assert answer == "resync_required"
    else:
        assert [(b.memory_id, b.deleted) for b in answer.blobs] == [("m2", True), ("m3", True)]
        assert answer.cursor == 5
