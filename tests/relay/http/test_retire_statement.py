"""The successor statement on the relay (PROTOCOL §19 last bullet; docs/rekey.md "The
successor statement"), on a real relay and PostgreSQL.

The relay cannot check a statement (it never holds the old vault's key): it checks its
shape (400 naming the field), stores it with the retire, and hands it back wherever it
names the successor: the retire's answer, every pull's `retired`, the 410 `vault_retired`
of a push (and of every route after the grace period), the event stream's `retired`.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engram_sync.shared_format.successor_statement import make_statement
from tests.relay.conftest import Relay
from tests.relay.sse import messages
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    module_relay_fixture,
    new_vault_id,
    pull,
    pull_ok,
    push,
    push_ok,
)

relay = module_relay_fixture()

AT = "2026-12-04T17:00:00.000000+00:00"


@pytest.fixture
def http(relay: Relay) -> Iterator[httpx.Client]:
    with client(relay) as c:
        yield c


def _statement(old: str, new: str, at: str = AT) -> str:
    return make_statement(secrets.token_bytes(32), old, new, at)


def _retire(http: httpx.Client, old: str, body: dict[str, Any]) -> httpx.Response:
    return http.post(f"/v1/vaults/{old}/retire", json=body)


def test_the_statement_is_stored_and_handed_back_wherever_the_successor_is(
    relay: Relay, http: httpx.Client
) -> None:
    old, new = new_vault_id("st-old"), new_vault_id("st-new")
    push_ok(http, old, Sealer(old).blobs(2))
    statement = _statement(old, new)
    answer = _retire(http, old, {"successor": new, "statement": statement, "stated_at": AT})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["successor"], body["statement"], body["stated_at"]) == (new, statement, AT)
    said = {"successor": new, "statement": statement, "stated_at": AT}

    page = pull_ok(http, old, cursor=0)  # every pull's `retired`, both modes
    assert page["retired"] == {**said, "erase_after": body["erase_after"]}
    assert pull_ok(http, old)["retired"] == page["retired"]

    refused = assert_error(push(http, old, Sealer(old).blobs(1, prefix="x")), 410, "vault_retired")
    assert {k: refused[k] for k in said} == said  # the push's 410

    with http.stream("GET", f"/v1/vaults/{old}/events", params={"cursor": 0}) as response:
        received = list(messages(response))
    assert received[1].event == "retired"
    assert received[1].json() == page["retired"]

    relay.sql("UPDATE vaults SET erase_after = retired_at WHERE vault_id = $1", old)
    gone = assert_error(pull(http, old, cursor=0), 410, "vault_retired")  # after the grace
    assert {k: gone[k] for k in said} == said

    again = _retire(http, old, {"successor": new, "statement": statement, "stated_at": AT})
    assert {k: again.json()[k] for k in said} == said  # idempotent, the same statement


def test_without_a_statement_the_answers_are_as_before(http: httpx.Client) -> None:
    old, new = new_vault_id("nost-old"), new_vault_id("nost-new")
    push_ok(http, old, Sealer(old).blobs(1))
    body = _retire(http, old, {"successor": new}).json()
    assert "statement" not in body
    assert pull_ok(http, old, cursor=0)["retired"] == {
        "successor": new,
        "erase_after": body["erase_after"],
    }
    refused = assert_error(push(http, old, Sealer(old).blobs(1, prefix="x")), 410, "vault_retired")
    assert set(refused) == {"error", "code", "successor"}


def test_the_first_statement_stands_and_a_missing_one_is_filled_in(http: httpx.Client) -> None:
    old, new = new_vault_id("first-old"), new_vault_id("first-new")
    push_ok(http, old, Sealer(old).blobs(1))
    assert _retire(http, old, {"successor": new}).status_code == 200  # e.g. the operator's
    first = _statement(old, new)
    filled = _retire(http, old, {"successor": new, "statement": first, "stated_at": AT})
    assert filled.status_code == 200, filled.text
    assert filled.json()["statement"] == first  # the re-keying device's, stored after all
    other = _statement(old, new, "2027-01-01T00:00:00Z")
    kept = _retire(http, old, {"successor": new, "statement": other, "stated_at": "2027"})
    assert kept.status_code == 200
    assert (kept.json()["statement"], kept.json()["stated_at"]) == (first, AT)  # never replaced
    assert pull_ok(http, old, cursor=0)["retired"]["statement"] == first


GOOD = "A" * 43 + "="  # base64 of 32 bytes


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"statement": GOOD}, "stated_at"),
        ({"stated_at": AT}, "statement"),
        ({"statement": GOOD, "stated_at": None}, "stated_at"),
        ({"statement": "not base64!", "stated_at": AT}, "statement"),
        ({"statement": "A" * 42 + "==", "stated_at": AT}, "statement"),  # 31 bytes
        ({"statement": "A" * 64, "stated_at": AT}, "statement"),  # 48 bytes
        ({"statement": "A" * 5000, "stated_at": AT}, "statement"),
        ({"statement": 12, "stated_at": AT}, "statement"),
        ({"statement": GOOD, "stated_at": "x" * 65}, "stated_at"),
        ({"statement": GOOD, "stated_at": ""}, "stated_at"),
        ({"statement": GOOD, "stated_at": "2026\x01"}, "stated_at"),  # NUL: bodies.py
        ({"statement": GOOD, "stated_at": ["2026"]}, "stated_at"),
    ],
)
def test_a_bad_statement_is_a_400_naming_the_field(
    http: httpx.Client, extra: dict[str, Any], field: str
) -> None:
    old, new = new_vault_id("bad-st"), new_vault_id("bad-new")
    response = _retire(http, old, {"successor": new, **extra})
    assert assert_error(response, 400)["field"] == field
    assert push_ok(http, old, Sealer(old).blobs(1))["accepted"] == 1  # not retired


def test_a_statement_without_a_successor_is_a_400(http: httpx.Client) -> None:
    old = new_vault_id("st-none")
    response = _retire(http, old, {"successor": None, "statement": GOOD, "stated_at": AT})
    assert assert_error(response, 400, "invalid_request")["field"] == "statement"
    assert push_ok(http, old, Sealer(old).blobs(1))["accepted"] == 1
