"""The vault digest carried in push answers and a cursor pull's last page (ours, issue 36;
docs/digest.md "Carried in push and pull answers"; relay.store.carried_digest), over real
HTTP: each one is what `GET /digest` answers at its sequence, or absent.

`GET /digest` itself is checked against the rows with hashlib in test_digest.py.
"""

from __future__ import annotations

import base64
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from engram_sync.relay.store.compaction import compact_vault
from engram_sync.shared_format.wire import SyncBlob
from tests.relay.conftest import Relay
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    module_relay_fixture,
    new_vault_id,
    push,
    push_ok,
    run_db,
)

pytestmark = pytest.mark.both_databases

relay = module_relay_fixture()


@pytest.fixture
def http(relay: Relay) -> Any:
    with client(relay) as c:
        yield c


def _digest(http: httpx.Client, vault: str) -> dict[str, Any]:
    response = http.get(f"/v1/vaults/{vault}/digest")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _push(http: httpx.Client, vault: str, blobs: list[SyncBlob]) -> dict[str, Any]:
    """A push asking for the digest (`?digest=1`)."""
    response = push(http, vault, blobs, params={"digest": 1})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _pull(http: httpx.Client, vault: str, **params: Any) -> dict[str, Any]:
    """A pull, asking for the digest in cursor mode unless told `digest=None`."""
    if "cursor" in params:
        params.setdefault("digest", 1)
    params = {k: v for k, v in params.items() if v is not None}
    response = http.get(f"/v1/vaults/{vault}/pull", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_info_names_the_feature(http: httpx.Client) -> None:
    assert "digest-carried" in http.get("/v1/info").json()["features"]


def test_each_push_answer_carries_the_digest_after_its_commit(http: httpx.Client) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    other = Sealer(vault, sealer.keys)
    pushes = [
        [sealer.blob(f"m{i}", 1) for i in range(20)],
        [other.blob("m1", 5), sealer.blob("m2", 2, deleted=True)],  # a replacement, a tombstone
        [sealer.blob("m3", 1), sealer.blob("m4", 3), sealer.blob("m4", 4)],  # stale, one taken
        [sealer.blob("m3", 1)],  # all stale: nothing committed, the digest as it stands
    ]
    for blobs in pushes:
        body = _push(http, vault, blobs)
        assert body["vault_digest"] == _digest(http, vault)
        assert body["vault_digest"]["cursor"] == body["cursor"]
    assert body["vault_digest"]["count"] == 20
    assert body["vault_digest"]["cursor"] == 23


def test_the_last_page_carries_the_digest_at_the_head(http: httpx.Client) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.blob(f"m{i}", 1) for i in range(5)])
    push_ok(http, vault, [sealer.blob("m1", 2, deleted=True)])
    first = _pull(http, vault, cursor=0, limit=4)
    assert first["has_more"] is True
    assert "vault_digest" not in first  # not at the head: nothing carried
    last = _pull(http, vault, cursor=first["cursor"], limit=4)
    assert last["has_more"] is False
    assert last["cursor"] == last["head"] == 6
    assert (
        last["vault_digest"]
        == _digest(http, vault)
        == {
            "cursor": 6,
            "count": 5,
            "digest": last["vault_digest"]["digest"],
        }
    )
    empty = _pull(http, vault, cursor=6)  # nothing beyond the cursor: carried at the head
    assert (empty["blobs"], empty["vault_digest"]) == ([], last["vault_digest"])
    whole = _pull(http, vault, cursor=0)  # one page to the head
    assert whole["vault_digest"] == last["vault_digest"]


def test_no_digest_where_a_page_does_not_end_at_the_head(relay: Relay, http: httpx.Client) -> None:
    """Above the last blob only compacted tombstones (the page's cursor jumps to the head,
    PROTOCOL §9, §12): no row at the head, nothing carried; the device asks `/digest`."""
    vault = new_vault_id()
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.blob(f"m{i}", 1) for i in range(3)])
    push_ok(http, vault, [sealer.blob("m1", 2, deleted=True), sealer.blob("m2", 2, deleted=True)])

    async def work(conn: asyncpg.Connection) -> int:
        await conn.execute(
            "UPDATE blobs SET received_at = now() - interval '40 days' WHERE vault_id = $1", vault
        )
        await conn.execute(
            "UPDATE devices SET last_seen = now() - interval '40 days' WHERE vault_id = $1", vault
        )
        return (await compact_vault(conn, vault, timedelta(days=30))).removed

    assert run_db(relay.database_url, work) == 2
    page = _pull(http, vault, cursor=0)
    assert (len(page["blobs"]), page["has_more"], page["cursor"]) == (1, False, 5)
    assert "vault_digest" not in page
    assert _digest(http, vault)["count"] == 1


def test_no_digest_unless_asked_nor_for_a_legacy_pull_or_an_unknown_vault(
    http: httpx.Client,
) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    assert "vault_digest" not in push_ok(http, vault, [sealer.blob("m0", 1)])  # not asked
    assert "vault_digest" in _push(http, vault, [sealer.blob("m1", 1)])  # asked
    assert "vault_digest" not in _pull(http, vault, cursor=0, digest=None)
    assert "vault_digest" not in _pull(http, vault, digest=1)  # the `since` mode: §5 only
    assert "vault_digest" not in _pull(http, new_vault_id(), cursor=0)
    assert base64.b64decode(_pull(http, vault, cursor=0)["vault_digest"]["digest"]) != bytes(32)


@pytest.mark.parametrize("route", ["push", "pull"])
def test_a_bad_digest_parameter_is_a_400_naming_it(http: httpx.Client, route: str) -> None:
    vault = new_vault_id()
    if route == "push":
        response = push(http, vault, [Sealer(vault).blob("m0", 1)], params={"digest": "maybe"})
    else:
        response = http.get(f"/v1/vaults/{vault}/pull", params={"cursor": 0, "digest": "maybe"})
    body = assert_error(response, 400)
    assert body["field"] == "digest"
    assert "digest" in body["error"]
    assert http.get(f"/v1/vaults/{vault}/pull?cursor=0").json()["blobs"] == []  # none written
