"""Pull semantics (PROTOCOL §5, §7, §9) and the stats routes, over real HTTP."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from engram_sync.shared_format import parse_rfc3339
from tests.relay.conftest import Relay
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    generation,
    module_relay_fixture,
    new_vault_id,
    pull,
    pull_all,
    pull_ok,
    push_in_batches,
    push_ok,
    versions,
)

#: The same tests on the Citus cluster too, by default (issue 18, tests/conftest.py).
pytestmark = pytest.mark.both_databases

relay = module_relay_fixture()


@pytest.fixture(scope="module")
def big_vault(relay: Relay) -> tuple[str, list[str]]:
    """A vault holding 1,200 blobs, pushed in batches of at most 1,000."""
    vault = new_vault_id("big")
    blobs = Sealer(vault).blobs(1200)
    with client(relay) as http:
        assert push_in_batches(http, vault, blobs, batch=1000) == 1200
    return vault, [b.memory_id for b in blobs]


# --- cursor mode (§9) ----------------------------------------------------------------------


def test_cursor_pages_in_seq_order_with_has_more(http: httpx.Client, vault: str) -> None:
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.blob(m, 1) for m in "abcde"])
    push_ok(http, vault, [sealer.blob("a", 2)])  # overwriting moves "a" to the end
    page = pull_ok(http, vault, cursor=0, limit=2)
    assert (versions(page["blobs"]), page["has_more"], page["cursor"]) == (
        [("b", 1), ("c", 1)],
        True,
        3,
    )
    page = pull_ok(http, vault, cursor=3, limit=2)
    assert (versions(page["blobs"]), page["has_more"], page["cursor"]) == (
        [("d", 1), ("e", 1)],
        True,
        5,
    )
    # Exactly `limit` blobs left: limit+1 rows were asked for, so has_more is false.
    page = pull_ok(http, vault, cursor=4, limit=2)
    assert (versions(page["blobs"]), page["has_more"], page["cursor"]) == (
        [("e", 1), ("a", 2)],
        False,
        6,
    )
    # Past the end: an empty page that keeps the caller's cursor; the head stays the
    # vault's sequence even below the cursor (how a device sees a restore, PROTOCOL §17).
    for cursor in (6, 1000):
        assert pull_ok(http, vault, cursor=cursor) == {
            "blobs": [],
            "has_more": False,
            "cursor": cursor,
            "generation": generation(http),
            "head": 6,
        }


def test_cursor_is_the_seq_of_the_last_blob(relay: Relay, http: httpx.Client, vault: str) -> None:
    sealer = Sealer(vault)
    for i in range(3):
        push_ok(http, vault, [sealer.blob(f"m{i}", 1), sealer.blob(f"n{i}", 1)])
    seqs = [
        r["seq"] for r in relay.sql("SELECT seq FROM blobs WHERE vault_id = $1 ORDER BY seq", vault)
    ]
    assert seqs == [1, 2, 3, 4, 5, 6]
    cursors = []
    cursor = 0
    while True:
        page = pull_ok(http, vault, cursor=cursor, limit=4)
        cursors.append(page["cursor"])
        cursor = page["cursor"]
        if not page["has_more"]:
            break
    assert cursors == [4, 6]


def test_limit_is_capped_at_1000(http: httpx.Client, big_vault: tuple[str, list[str]]) -> None:
    vault, memory_ids = big_vault
    for limit in (1001, 5000, None):
        page = pull_ok(http, vault, cursor=0, limit=limit)
        assert len(page["blobs"]) == 1000
        assert page["has_more"] is True
        assert page["cursor"] == 1000
    rest = pull_ok(http, vault, cursor=1000, limit=5000)
    assert (len(rest["blobs"]), rest["has_more"], rest["cursor"]) == (200, False, 1200)
    paged, cursor = pull_all(http, vault, limit=450)
    assert [b["memory_id"] for b in paged] == memory_ids
    assert cursor == 1200
    # Legacy mode caps too.
    legacy = pull_ok(http, vault, limit=100_000)
    assert (len(legacy["blobs"]), legacy["has_more"]) == (1000, True)


def test_limit_zero_means_the_default(http: httpx.Client, big_vault: tuple[str, list[str]]) -> None:
    vault, memory_ids = big_vault
    page = pull_ok(http, vault, cursor=0, limit=0)
    assert (len(page["blobs"]), page["has_more"]) == (1000, True)
    paged, _ = pull_all(http, vault, limit=0)  # terminates: never an empty page with has_more
    assert [b["memory_id"] for b in paged] == memory_ids
    legacy = pull_ok(http, vault, limit=0)
    assert (len(legacy["blobs"]), legacy["has_more"]) == (1000, True)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"cursor": -1}, "cursor"),
        ({"cursor": "abc"}, "cursor"),
        ({"cursor": 2**63}, "cursor"),
        ({"limit": -1}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"since": "not a time"}, "since"),
        ({"since": "2026-08-30T12:00:00"}, "since"),  # no offset
        ({"since": "2026-02-30T12:00:00+00:00"}, "since"),
    ],
)
def test_bad_query_parameters_are_400_naming_them(
    http: httpx.Client, vault: str, params: dict[str, Any], field: str
) -> None:
    body = assert_error(pull(http, vault, **params), 400)
    assert body["field"] == field
    assert field in body["error"]


def test_reads_of_an_unknown_vault_reveal_nothing(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id("nobody")
    current = generation(http)
    assert pull_ok(http, vault, cursor=0) == {
        "blobs": [],
        "has_more": False,
        "cursor": 0,
        "generation": current,
        "head": 0,
    }
    assert pull_ok(http, vault) == {"blobs": [], "has_more": False, "generation": current}
    assert pull_ok(http, vault, since="2026-01-01T00:00:00+00:00")["blobs"] == []
    expected = {"vault_id": vault, "total_blobs": 0, "latest_sync": None}
    assert http.get(f"/v1/vaults/{vault}/stats").json() == expected
    assert http.get(f"/sync/{vault}/stats").json() == expected
    assert http.get(f"/v1/vaults/{vault}/devices").json() == {"vault_id": vault, "devices": []}
    assert relay.sql("SELECT 1 FROM vaults WHERE vault_id = $1", vault) == []


# --- legacy mode (§7) ----------------------------------------------------------------------


def test_legacy_mode_compares_instants_not_text(http: httpx.Client, vault: str) -> None:
    sealer = Sealer(vault)
    # Text order and instant order disagree: "T14:00+02:00" is 12:00Z, "T12:30+00:00" is later.
    push_ok(
        http,
        vault,
        [
            sealer.blob("late", 1, created_at="2026-08-30T12:30:00+00:00"),
            sealer.blob("early", 1, created_at="2026-08-30T14:00:00+02:00"),
            sealer.blob("west", 1, created_at="2026-08-30T07:45:00.000001-05:00"),  # 12:45Z
        ],
    )
    everything = pull_ok(http, vault)
    assert [b["memory_id"] for b in everything["blobs"]] == ["early", "late", "west"]
    assert "cursor" not in everything  # legacy answers carry only the core fields
    since = pull_ok(http, vault, since="2026-08-30T12:15:00+00:00")
    assert [b["memory_id"] for b in since["blobs"]] == ["late", "west"]
    # The same instant written with another offset selects the same blobs, inclusively.
    for equivalent in ("2026-08-30T14:30:00+02:00", "2026-08-30T12:30:00Z"):
        assert [b["memory_id"] for b in pull_ok(http, vault, since=equivalent)["blobs"]] == [
            "late",
            "west",
        ]
    assert pull_ok(http, vault, since="")["blobs"] == everything["blobs"]  # empty = none


def test_unencoded_plus_arriving_as_a_space_is_accepted(http: httpx.Client, vault: str) -> None:
    sealer = Sealer(vault)
    push_ok(
        http,
        vault,
        [
            sealer.blob("before", 1, created_at="2026-08-30T11:00:00+00:00"),
            sealer.blob("after", 1, created_at="2026-08-30T13:00:00+00:00"),
        ],
    )
    encoded = http.get(f"/v1/vaults/{vault}/pull?since=2026-08-30T12:00:00%2B00:00")
    raw = http.get(f"/v1/vaults/{vault}/pull?since=2026-08-30T12:00:00+00:00")
    assert raw.url.query == b"since=2026-08-30T12:00:00+00:00"  # the + really went unencoded
    assert encoded.status_code == raw.status_code == 200, raw.text
    assert [b["memory_id"] for b in raw.json()["blobs"]] == ["after"]
    assert raw.json() == encoded.json()


def test_legacy_paging_with_shared_created_at(http: httpx.Client, vault: str) -> None:
    """A legacy client pages with since = the last created_at it saw (groups < limit)."""
    sealer = Sealer(vault)
    # One instant written two ways (a group of 3), then groups of 1, 3 and 1; limit 4.
    stamps = ["2026-08-30T12:00:00+00:00"] * 2 + ["2026-08-30T14:00:00+02:00"]
    stamps += ["2026-08-30T12:00:01.5+00:00"] + ["2026-08-30T12:00:02+00:00"] * 3
    stamps += ["2026-08-30T12:00:03.000000001+00:00"]
    blobs = [sealer.blob(f"m{i}", 1, created_at=s) for i, s in enumerate(stamps)]
    push_ok(http, vault, blobs[::-1])  # seq order differs from created_at order
    seen: dict[str, dict[str, Any]] = {}
    since: str | None = None
    pages = 0
    while True:
        pages += 1
        assert pages < 50, "legacy paging does not terminate"
        page = pull_ok(http, vault, since=since, limit=4)
        instants = [parse_rfc3339(b["created_at"]) for b in page["blobs"]]
        assert instants == sorted(instants)
        if since is not None:
            assert all(i >= parse_rfc3339(since) for i in instants)
        for blob in page["blobs"]:
            seen[blob["memory_id"]] = blob
        if not page["has_more"]:
            break
        since = page["blobs"][-1]["created_at"]
    assert sorted(seen) == sorted(b.memory_id for b in blobs)
    assert {m: b["created_at"] for m, b in seen.items()} == {
        b.memory_id: b.created_at for b in blobs
    }


def test_cursor_wins_over_since(http: httpx.Client, vault: str) -> None:
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.blob("old", 1, created_at="2020-01-01T00:00:00+00:00")])
    page = pull_ok(http, vault, cursor=0, since="2026-01-01T00:00:00+00:00")
    assert [b["memory_id"] for b in page["blobs"]] == ["old"]
    assert page["cursor"] == 1


# --- stats ---------------------------------------------------------------------------------


def test_stats_count_live_blobs_and_the_newest_created_at(http: httpx.Client, vault: str) -> None:
    sealer = Sealer(vault)
    push_ok(
        http,
        vault,
        [
            sealer.blob("a", 1, created_at="2026-08-30T12:30:00.000000500+00:00"),
            sealer.blob("b", 1, created_at="2026-08-30T14:00:00+02:00"),  # 12:00Z, text-larger
            sealer.blob("c", 1, created_at="2026-08-30T11:00:00+00:00"),
        ],
    )
    stats = http.get(f"/v1/vaults/{vault}/stats").json()
    assert stats == {
        "vault_id": vault,
        "total_blobs": 3,
        "latest_sync": "2026-08-30T12:30:00.000000500+00:00",  # the newest instant, verbatim
    }
    push_ok(http, vault, [sealer.blob("c", 2, deleted=True, created_at="2026-08-30T10:00:00Z")])
    stats = http.get(f"/v1/vaults/{vault}/stats").json()
    assert stats["total_blobs"] == 2  # live blobs only
    assert http.get(f"/sync/{vault}/stats").json() == stats
