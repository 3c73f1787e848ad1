"""Idempotency keys on the routes that create something (docs/retries.md, migration 0007).

A repeat under one key answers the first answer and creates nothing more; without a key, or
with another key, each request creates its own (the positive case next to every check).
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import asyncpg
import httpx
import pytest

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.domain.idempotency_keys import (
    IdempotencyKeyReusedError,
    IdempotentRequest,
    InvalidIdempotencyKeyError,
)
from engram_sync.shared_format.handoff import new_handoff_keypair
from tests.relay.accounts.helpers import PASSWORD, http, new_email, signup
from tests.relay.conftest import ADMIN_KEY, Relay
from tests.relay.support import new_vault_id


def new_key() -> str:
    return secrets.token_urlsafe(16)  # 22 characters, 128 bits


def post(relay: Relay, token: str | None, path: str, body: Any, key: str | None) -> httpx.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    with http(relay, token) as c:
        return c.post(path, json=body, headers=headers)


async def _count(relay: Relay, sql: str, *args: Any) -> int:
    conn = await asyncpg.connect(to_libpq_url(relay.database_url))
    try:
        return int(await conn.fetchval(sql, *args))
    finally:
        await conn.close()


def count(relay: Relay, sql: str, *args: Any) -> int:
    return asyncio.run(_count(relay, sql, *args))


# -- the key, unit ----------------------------------------------------------------------


def test_the_lookup_separates_scopes_routes_and_keys() -> None:
    key = new_key()
    one = IdempotentRequest.of(key, scope="account:a", route="POST /x", body=b"{}")
    assert (
        one.lookup
        == IdempotentRequest.of(key, scope="account:a", route="POST /x", body=b"{}").lookup
    )
    for other in (
        IdempotentRequest.of(key, scope="account:b", route="POST /x", body=b"{}"),
        IdempotentRequest.of(key, scope="account:a", route="POST /y", body=b"{}"),
        IdempotentRequest.of(new_key(), scope="account:a", route="POST /x", body=b"{}"),
    ):
        assert other.lookup != one.lookup


def test_a_sealed_answer_opens_only_for_the_same_body() -> None:
    key = new_key()
    first = IdempotentRequest.of(key, scope="s", route="r", body=b'{"a":1}')
    sealed = first.seal(b'{"key":"en_secret"}')
    assert b"en_secret" not in sealed
    again = IdempotentRequest.of(key, scope="s", route="r", body=b'{"a":1}')
    assert again.open(first.request_mac, sealed) == b'{"key":"en_secret"}'
    changed = IdempotentRequest.of(key, scope="s", route="r", body=b'{"a":2}')
    with pytest.raises(IdempotencyKeyReusedError):
        changed.open(first.request_mac, sealed)


@pytest.mark.parametrize("bad", ["short", "x" * 65, "has space in it 0123456789", "ключ" * 8])
def test_malformed_keys_are_refused(bad: str) -> None:
    with pytest.raises(InvalidIdempotencyKeyError):
        IdempotentRequest.of(bad, scope="s", route="r", body=b"")
    assert IdempotentRequest.of("A" * 22, scope="s", route="r", body=b"")  # the bounds hold


# -- the routes -------------------------------------------------------------------------


def test_a_repeated_key_mint_answers_the_same_key_and_mints_no_second(served: Relay) -> None:
    account = signup(served)
    vault_id = new_vault_id()
    body = {"vault_id": vault_id, "label": "laptop"}
    key = new_key()
    first = post(served, account.token, "/account/keys", body, key)
    again = post(served, account.token, "/account/keys", body, key)
    assert first.status_code == again.status_code == 200, first.text + again.text
    assert again.json() == first.json()
    sql = "SELECT count(*) FROM api_keys WHERE account_id = $1 AND vault_id = $2"
    assert count(served, sql, account.account_id, vault_id) == 1
    # another key, or none, mints another
    assert (
        post(served, account.token, "/account/keys", body, new_key()).json()["id"]
        != first.json()["id"]
    )
    assert (
        post(served, account.token, "/account/keys", body, None).json()["id"] != first.json()["id"]
    )
    assert count(served, sql, account.account_id, vault_id) == 3


def test_one_key_with_another_body_is_refused_and_names_the_header(served: Relay) -> None:
    account = signup(served)
    key = new_key()
    assert (
        post(served, account.token, "/account/keys", {"vault_id": new_vault_id()}, key).status_code
        == 200
    )
    reused = post(served, account.token, "/account/keys", {"vault_id": new_vault_id()}, key)
    assert reused.status_code == 422
    assert reused.json()["code"] == "idempotency_key_reused"
    bad = post(served, account.token, "/account/keys", {"vault_id": new_vault_id()}, "short")
    assert bad.status_code == 400
    assert bad.json()["field"] == "Idempotency-Key"


def test_keys_of_two_accounts_never_meet(served: Relay) -> None:
    one, two = signup(served), signup(served)
    key = new_key()
    a = post(served, one.token, "/account/keys", {"vault_id": new_vault_id()}, key)
    b = post(served, two.token, "/account/keys", {"vault_id": new_vault_id()}, key)
    assert a.status_code == b.status_code == 200
    assert a.json()["id"] != b.json()["id"]


def test_a_repeated_signup_answers_the_same_session(served: Relay) -> None:
    email, key = new_email(), new_key()
    body = {"email": email, "password": PASSWORD}
    first = post(served, None, "/auth/signup", body, key)
    again = post(served, None, "/auth/signup", body, key)
    assert first.status_code == again.status_code == 200, again.text
    assert again.json() == first.json()
    assert (
        count(
            served,
            "SELECT count(*) FROM sessions WHERE account_id = $1",
            first.json()["account_id"],
        )
        == 1
    )
    # without the key the repeat is what it always was
    repeat = post(served, None, "/auth/signup", body, None)
    assert repeat.status_code == 409
    assert repeat.json()["code"] == "email_taken"


def test_a_repeated_pairing_code_and_redeem_answer_the_first(served: Relay) -> None:
    vault_id, key = new_vault_id(), new_key()
    path = f"/v1/vaults/{vault_id}/pairing-codes"
    first = post(served, ADMIN_KEY, path, {"label": "phone"}, key)
    again = post(served, ADMIN_KEY, path, {"label": "phone"}, key)
    assert first.status_code == again.status_code == 200, again.text
    assert again.json()["code"] == first.json()["code"]
    live = "SELECT count(*) FROM pairing_codes WHERE vault_id = $1 AND redeemed_at IS NULL"
    assert count(served, live, vault_id) == 1
    assert (
        post(served, ADMIN_KEY, path, {"label": "phone"}, new_key()).json()["code"]
        != first.json()["code"]
    )
    assert count(served, live, vault_id) == 2
    redeem = {"code": first.json()["code"], "device_id": "dev-idem", "label": "phone"}
    rkey = new_key()
    traded = post(served, None, "/pair/redeem", redeem, rkey)
    retried = post(served, None, "/pair/redeem", redeem, rkey)
    assert traded.status_code == retried.status_code == 200, retried.text
    assert retried.json()["api_key"] == traded.json()["api_key"]
    # the code itself is still single use: a second trade without the key is refused
    assert post(served, None, "/pair/redeem", redeem, new_key()).status_code == 410


def test_a_repeated_handoff_request_answers_the_same_request(served: Relay) -> None:
    vault_id, key = new_vault_id(), new_key()
    body = {"public_key": new_handoff_keypair().public_key_b64url, "label": "bob"}
    path = f"/v1/vaults/{vault_id}/handoff"
    first = post(served, ADMIN_KEY, path, body, key)
    again = post(served, ADMIN_KEY, path, body, key)
    assert first.status_code == again.status_code == 200, again.text
    assert again.json()["request_id"] == first.json()["request_id"]
    assert count(served, "SELECT count(*) FROM handoff_requests WHERE vault_id = $1", vault_id) == 1
    assert (
        post(served, ADMIN_KEY, path, body, new_key()).json()["request_id"]
        != first.json()["request_id"]
    )


def test_concurrent_repeats_mint_one_key_and_all_get_it(served: Relay) -> None:
    account = signup(served)
    vault_id, key = new_vault_id(), new_key()
    body = {"vault_id": vault_id}

    async def all_at_once() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=served.url, headers={"Authorization": f"Bearer {account.token}"}, timeout=60
        ) as c:
            return list(
                await asyncio.gather(
                    *(
                        c.post("/account/keys", json=body, headers={"Idempotency-Key": key})
                        for _ in range(12)
                    )
                )
            )

    answers = asyncio.run(all_at_once())
    assert {r.status_code for r in answers} == {200}, [r.text for r in answers]
    assert len({r.json()["key"] for r in answers}) == 1
    sql = "SELECT count(*) FROM api_keys WHERE account_id = $1 AND vault_id = $2"
    assert count(served, sql, account.account_id, vault_id) == 1


def test_the_database_holds_no_minted_key_and_no_password(served: Relay) -> None:
    email, key = new_email(), new_key()
    password = "a password only the user knows 1234"
    signed = post(served, None, "/auth/signup", {"email": email, "password": password}, key)
    assert signed.status_code == 200
    token = signed.json()["session_token"]
    minted = post(served, token, "/account/keys", {"vault_id": new_vault_id()}, new_key()).json()

    async def rows() -> list[bytes]:
        conn = await asyncpg.connect(to_libpq_url(served.database_url))
        try:
            found = await conn.fetch("SELECT lookup, request_mac, answer FROM idempotency_keys")
        finally:
            await conn.close()
        return [bytes(v) for r in found for v in r.values()]

    stored = b"".join(asyncio.run(rows()))
    assert len(stored) > 0  # the rows are there
    for secret in (minted["key"], token, password, email.lower(), key):
        assert secret.encode() not in stored


def test_a_redeem_that_makes_nothing_keeps_its_writes_and_records_nothing(served: Relay) -> None:
    """An expired code is erased by the redeem that finds it, key or not; the key is not
    held by the refusal, so its repeat is refused the same way."""
    vault_id, key = new_vault_id(), new_key()
    code = post(served, ADMIN_KEY, f"/v1/vaults/{vault_id}/pairing-codes", {}, None).json()["code"]
    served.sql(
        "UPDATE pairing_codes SET expires_at = now() - interval '1 minute' WHERE vault_id = $1",
        vault_id,
    )
    body = {"code": code, "device_id": "dev-late", "label": "late"}
    for _ in range(2):
        refused = post(served, None, "/pair/redeem", body, key)
        assert refused.status_code == 410
        assert refused.json()["code"] == "code_invalid"
    assert served.sql("SELECT * FROM pairing_codes WHERE vault_id = $1", vault_id) == []
    assert count(served, "SELECT count(*) FROM idempotency_keys WHERE answer = ''::bytea") == 0
