"""Pull pages capped by bytes as well as by count (PROTOCOL §7, §9, §11; issue 14 item 5).

A relay with a small page budget (10,000 base64 characters) over real HTTP: a cursor
page's ciphertext stays within the budget (issue 31: before, a page ended with the blob
that crossed it; a legacy `since` page still may, relay.store.sync), a page always
carries at least one blob (alone when it is larger than the budget), and says `has_more`
as usual; /v1/info advertises the budget. The statement itself is also run directly, to
check that the row off the page comes without its ciphertext (the relay never holds
more than the budget, or one larger blob).
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from msgspec import UNSET

from engram_sync.client._http.relay_client import PULL_PAGE_BUDGET_BYTES
from engram_sync.relay.services.config import (
    DEFAULT_MAX_BLOB_BYTES,
    DEFAULT_MAX_PAGE_BYTES,
    config_from_env,
)
from engram_sync.relay.store.sync import PULL_PAGE, split_page
from engram_sync.shared_format.wire import MAX_PULL_LIMIT, RelayInfo, decode_json
from tests.relay.conftest import Relay
from tests.relay.support import (
    Sealer,
    client,
    module_relay_fixture,
    new_vault_id,
    pull_ok,
    push_ok,
    run_db,
)

#: The same tests on the Citus cluster too, by default (issue 18, tests/conftest.py).
pytestmark = pytest.mark.both_databases

BUDGET = 10_000
CHARS = 4_000  # two fit the budget (8,000 characters), a third would pass it (12,000)


relay = module_relay_fixture(max_page_bytes=BUDGET)


def _sized_vault(relay: Relay, sizes: list[int]) -> str:
    vault = new_vault_id("pages")
    sealer = Sealer(vault)
    with client(relay) as http:
        push_ok(http, vault, [sealer.sized(f"m{i:02d}", 1, n) for i, n in enumerate(sizes)])
    return vault


def _pages(relay: Relay, vault: str, **params: Any) -> list[tuple[list[str], bool]]:
    """(memory ids, has_more) of each page until has_more is false, in either mode."""
    pages: list[tuple[list[str], bool]] = []
    cursor_mode = "cursor" in params
    with client(relay) as http:
        for _ in range(100):
            page = pull_ok(http, vault, **params)
            ids = [b["memory_id"] for b in page["blobs"]]
            pages.append((ids, page["has_more"]))
            if not page["has_more"]:
                return pages
            if cursor_mode:
                params["cursor"] = page["cursor"]
            else:
                params["since"] = page["blobs"][-1]["created_at"]
    raise AssertionError("pull never finished")


def test_a_cursor_page_stays_within_the_budget(relay: Relay) -> None:
    vault = _sized_vault(relay, [CHARS] * 7)
    ids = [f"m{i:02d}" for i in range(7)]
    assert _pages(relay, vault, cursor=0) == [
        (ids[0:2], True),
        (ids[2:4], True),
        (ids[4:6], True),
        (ids[6:], False),
    ]
    # The count limit still applies below the budget.
    assert _pages(relay, vault, cursor=0, limit=2)[0] == (ids[0:2], True)


def test_a_blob_larger_than_the_budget_still_travels_alone(relay: Relay) -> None:
    vault = _sized_vault(relay, [3 * BUDGET, 40, 3 * BUDGET])
    assert _pages(relay, vault, cursor=0) == [(["m00"], True), (["m01"], True), (["m02"], False)]


@pytest.mark.parametrize("mode", ["cursor", "since"])
def test_no_page_passes_the_budget_unless_one_blob_alone_does(relay: Relay, mode: str) -> None:
    # Sizes that cross the budget at every offset: each cursor page within the budget, a
    # blob larger than it alone and whole; the legacy mode still gets through the vault.
    sizes = [2_000, 7_996, 40, 9_996, 10_000, 4_000, 6_004, 3 * BUDGET, 5_000, 5_000, 1_000]
    vault = _sized_vault(relay, sizes)
    seen: dict[str, int] = {}
    with client(relay) as http:
        params: dict[str, Any] = {"cursor": 0} if mode == "cursor" else {}
        for _ in range(100):
            page = pull_ok(http, vault, **params)
            chars = [len(b["ciphertext"]) for b in page["blobs"]]
            assert chars
            if mode == "cursor":
                assert sum(chars) <= BUDGET or len(chars) == 1, chars
            else:  # legacy: re-sends its first blob, so it must hold the next whatever it is
                assert len(chars) <= 2 or sum(chars[:-1]) < BUDGET, chars
            seen.update({b["memory_id"]: len(b["ciphertext"]) for b in page["blobs"]})
            if not page["has_more"]:
                break
            if mode == "cursor":
                params["cursor"] = page["cursor"]
            else:
                params["since"] = page["blobs"][-1]["created_at"]
    assert seen == {f"m{i:02d}": n for i, n in enumerate(sizes)}


def test_a_since_page_is_capped_the_same_way(relay: Relay) -> None:
    vault = _sized_vault(relay, [CHARS] * 4)
    with client(relay) as http:
        first = pull_ok(http, vault)
    # the legacy mode's page may pass the budget by its last blob (relay.store.sync)
    assert [b["memory_id"] for b in first["blobs"]] == ["m00", "m01", "m02"]
    assert first["has_more"] is True
    # Paging by `since` re-sends the blob at the boundary instant (created_at >= since,
    # PROTOCOL §7), so count distinct ids.
    seen = {m for ids, _ in _pages(relay, vault, since="") for m in ids}
    assert seen == {"m00", "m01", "m02", "m03"}


def test_the_row_off_the_page_comes_without_its_ciphertext(relay: Relay) -> None:
    vault = _sized_vault(relay, [CHARS] * 5)

    async def read(conn: asyncpg.Connection) -> list[tuple[str, bool]]:
        rows = await conn.fetch(PULL_PAGE, vault, 0, 1000, BUDGET)
        return [(r["memory_id"], r["ciphertext"] is not None) for r in rows]

    # Two on the page, one to say has_more (no ciphertext), m03 and m04 not read at all.
    assert run_db(relay.database_url, read) == [("m00", True), ("m01", True), ("m02", False)]

    async def by_count(conn: asyncpg.Connection) -> tuple[list[str], bool]:
        page, has_more = split_page(await conn.fetch(PULL_PAGE, vault, 0, 2, 10**9), 2)
        return [r["memory_id"] for r in page], has_more

    # Below the budget the row past the limit is read whole, and only says has_more.
    assert run_db(relay.database_url, by_count) == (["m00", "m01"], True)


def test_info_advertises_the_page_budget(relay: Relay) -> None:
    with client(relay, key=None) as http:
        body = http.get("/v1/info").content
    assert decode_json(body, RelayInfo).max_page_bytes == BUDGET
    # An answer of an older relay, without the field, still decodes (additive, §11).
    old = b'{"protocol":"engram-sync/5.1","max_blobs_per_push":1000,"max_blob_bytes":1048576,'
    old += b'"max_pull_limit":1000,"max_body_bytes":67108864}'
    assert decode_json(old, RelayInfo).max_page_bytes is UNSET


def test_the_default_budget_keeps_honest_pages_within_the_client_cap() -> None:
    # Budget, plus the one blob that may pass it (a legacy `since` page), plus the JSON of
    # 1000 blobs' other fields (ids, hmac, created_at, seq: well under 1 KiB each) stays
    # below the client's cap.
    assert DEFAULT_MAX_PAGE_BYTES + DEFAULT_MAX_BLOB_BYTES + MAX_PULL_LIMIT * 1024 < (
        PULL_PAGE_BUDGET_BYTES // 2
    )


def test_the_budget_is_set_by_the_environment() -> None:
    env = {"ENGRAM_RELAY_MAX_PAGE_BYTES": "65536"}
    assert config_from_env("postgresql://u@h/db", env).max_page_bytes == 65536
    assert config_from_env("postgresql://u@h/db", {}).max_page_bytes == DEFAULT_MAX_PAGE_BYTES
    with pytest.raises(ValueError, match="max_page_bytes"):
        config_from_env("postgresql://u@h/db", {"ENGRAM_RELAY_MAX_PAGE_BYTES": "0"})
