"""Sign-up, sign-in, sessions, logout, the account view and account keys (PROTOCOL §13)."""

from __future__ import annotations

import pytest

from engram_sync.relay.http.routes import accounts as accounts_routes
from tests.relay.accounts.helpers import PASSWORD, http, new_email, signin, signup
from tests.relay.conftest import Relay
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    new_device_id,
    new_vault_id,
    pull_ok,
    push,
    push_ok,
)

WRAP = "A" * 80  # 60 bytes of standard base64: an opaque wrap as far as the relay knows
SALT = "B" * 24  # 18 bytes


def own_vault(relay: Relay, token: str, password: str = PASSWORD) -> str:
    """Store a (dummy, opaque) vault wrap so the account owns a fresh vault."""
    vault_id = new_vault_id("acct")
    with http(relay, token) as c:
        r = c.put(
            f"/account/vaults/{vault_id}/wrap", json={"wrapped_k": WRAP, "password": password}
        )
    assert r.status_code == 200, r.text
    return vault_id


def test_signup_signs_in_and_normalises_the_email(served: Relay) -> None:
    email = "  " + new_email() + " "
    with http(served) as c:
        r = c.post("/auth/signup", json={"email": email, "password": PASSWORD})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["email"] == email.strip().lower()
    assert body["account_id"].startswith("acct_")
    assert body["session_token"].startswith("ses_")
    assert body["expires_at"] > body["created_at"]
    stored = served.sql(
        "SELECT email, password_hash FROM accounts WHERE id = $1", body["account_id"]
    )
    assert stored[0]["email"] == email.strip().lower()
    assert stored[0]["password_hash"].startswith("$argon2id$v=19$m=19456,t=2,p=1$")
    with http(served, body["session_token"]) as c:
        me = c.get("/account")
    assert me.status_code == 200, me.text
    assert me.json() == {
        "account_id": body["account_id"],
        "email": email.strip().lower(),
        "created_at": body["created_at"],
        "vaults": [],
        "keys": [],
    }


def test_signup_refuses_a_taken_email_in_any_spelling(served: Relay) -> None:
    account = signup(served)
    with http(served) as c:
        again = c.post("/auth/signup", json={"email": account.email.upper(), "password": PASSWORD})
    assert_error(again, 409, "email_taken")


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        (
            {"email": "no-at-sign.example.org", "password": PASSWORD},
            400,
            "invalid_request",
            "email",
        ),
        ({"email": "a@b", "password": PASSWORD}, 400, "invalid_request", "email"),
        ({"email": "x@example.org", "password": "short-pw1"}, 400, "weak_password", "password"),
        ({"email": "x@example.org"}, 400, "invalid_request", "password"),
        ({"email": "x@example.org", "password": 12345678901}, 400, "invalid_request", "password"),
    ],
)
def test_signup_validation_names_the_field(
    served: Relay, body: dict[str, object], status: int, code: str, field: str
) -> None:
    with http(served) as c:
        response = c.post("/auth/signup", json=body)
    assert assert_error(response, status, code)["field"] == field


def test_signin_and_logout(served: Relay) -> None:
    account = signup(served)
    r = signin(served, account.email.upper(), PASSWORD)
    assert r.status_code == 200, r.text
    second = r.json()["session_token"]
    assert r.json()["account_id"] == account.account_id
    assert second != account.token
    with http(served, second) as c:
        assert c.post("/auth/logout").json() == {"logged_out": True}
        assert_error(c.get("/account"), 401, "unauthorized")
        assert_error(c.post("/auth/logout"), 401, "unauthorized")
    with account.client(served) as c:  # the other session is untouched
        assert c.get("/account").status_code == 200
    tokens = served.sql(
        "SELECT count(*) AS n FROM sessions WHERE account_id = $1", account.account_id
    )
    assert tokens[0]["n"] == 1


def test_unknown_email_and_wrong_password_get_the_same_answer(served: Relay) -> None:
    account = signup(served)
    wrong = signin(served, account.email, PASSWORD + "!")
    unknown = signin(served, new_email(), PASSWORD)
    assert_error(wrong, 401, "invalid_credentials")
    assert (wrong.status_code, wrong.json()) == (unknown.status_code, unknown.json())
    assert wrong.headers.get("www-authenticate") == unknown.headers.get("www-authenticate")


def test_expired_session_is_refused(served: Relay) -> None:
    account = signup(served)
    served.sql(
        "UPDATE sessions SET expires_at = now() - interval '1 minute' WHERE account_id = $1",
        account.account_id,
    )
    with account.client(served) as c:
        body = assert_error(c.get("/account"), 401, "unauthorized")
    assert "expired" in body["error"]


def test_session_tokens_are_stored_only_as_sha256(served: Relay) -> None:
    account = signup(served)
    rows = served.sql("SELECT token_hash FROM sessions WHERE account_id = $1", account.account_id)
    import hashlib

    assert [bytes(r["token_hash"]) for r in rows] == [
        hashlib.sha256(account.token.encode()).digest()
    ]


def test_account_keys_mint_list_use_and_revoke(served: Relay) -> None:
    account = signup(served)
    vault_id = own_vault(served, account.token)
    device = new_device_id()
    with account.client(served) as c:
        minted = c.post("/account/keys", json={"vault_id": vault_id, "device_id": device})
        assert minted.status_code == 200, minted.text
        key = minted.json()
        assert key["key"].startswith("en_")
        assert (key["vault_id"], key["device_id"], key["is_admin"]) == (vault_id, device, True)
        member = c.post("/account/keys", json={"vault_id": vault_id, "admin": False}).json()
        assert member["is_admin"] is False
        listed = c.get("/account").json()
    assert listed["vaults"] == [vault_id]
    assert {k["id"] for k in listed["keys"]} == {key["id"], member["id"]}
    assert all("key" not in k for k in listed["keys"])  # never the key again
    assert {k["prefix"] for k in listed["keys"]} == {key["prefix"], member["prefix"]}

    sealer = Sealer(vault_id)
    sealer.device_id = device
    with client(served, key["key"]) as vault:
        assert push_ok(vault, vault_id, [sealer.blob("m1", 1)])["accepted"] == 1
        assert len(pull_ok(vault, vault_id, cursor=0)["blobs"]) == 1
        # admin: may revoke another device of its vault
        assert vault.delete(f"/v1/vaults/{vault_id}/devices/{new_device_id()}").status_code == 200
        assert_error(vault.get(f"/v1/vaults/{new_vault_id()}/stats"), 403)
    with client(served, member["key"]) as vault:
        assert_error(vault.delete(f"/v1/vaults/{vault_id}/devices/{device}"), 403)

    with account.client(served) as c:
        assert c.delete(f"/account/keys/{key['id']}").json() == {"id": key["id"], "revoked": True}
        assert c.delete(f"/account/keys/{key['id']}").status_code == 200  # idempotent
        assert_error(c.delete("/account/keys/k_000000000000"), 404, "not_found")
        keys = {k["id"]: k["revoked"] for k in c.get("/account").json()["keys"]}
    assert keys == {key["id"]: True, member["id"]: False}
    with client(served, key["key"]) as vault:
        assert_error(push(vault, vault_id, [sealer.blob("m2", 2)]), 401, "unauthorized")


def test_account_keys_only_for_owned_vaults(served: Relay) -> None:
    alice, mallory = signup(served), signup(served)
    vault_id = own_vault(served, alice.token)
    with mallory.client(served) as c:
        assert_error(c.post("/account/keys", json={"vault_id": vault_id}), 403, "vault_owned")
        # nor can mallory revoke alice's key
    with alice.client(served) as c:
        key_id = c.post("/account/keys", json={"vault_id": vault_id}).json()["id"]
    with mallory.client(served) as c:
        assert_error(c.delete(f"/account/keys/{key_id}"), 404, "not_found")
        assert_error(c.post("/account/keys", json={"vault_id": ""}), 400, "invalid_request")


def test_key_for_a_revoked_device_is_refused(served: Relay) -> None:
    account = signup(served)
    vault_id = own_vault(served, account.token)
    device = new_device_id()
    with client(served) as operator:
        assert operator.delete(f"/v1/vaults/{vault_id}/devices/{device}").status_code == 200
    with account.client(served) as c:
        response = c.post("/account/keys", json={"vault_id": vault_id, "device_id": device})
    assert_error(response, 403, "device_revoked")


def test_signup_and_signin_are_rate_limited_per_ip(served: Relay) -> None:
    with http(served) as c:  # one address: invalid attempts are cheap and still counted
        answers = [c.post("/auth/signup", json={"email": "bad"}).status_code for _ in range(11)]
        limited = c.post("/auth/signup", json={"email": "bad"})
    assert answers[:10] == [400] * 10
    assert answers[10] == 429
    assert_error(limited, 429, "rate_limited")
    assert int(limited.headers["retry-after"]) >= 1
    with http(served) as other:  # another address is not affected
        assert other.post("/auth/signup", json={"email": "bad"}).status_code == 400
    with http(served, ip="127.9.9.9") as c:
        codes = [c.post("/auth/signin", json={}).status_code for _ in range(31)]
    assert codes[:30] == [400] * 30
    assert codes[30] == 429


def test_a_key_minted_again_for_a_device_replaces_its_old_one(served: Relay) -> None:
    # a browser unlocking as the same device mints each time: one key stays, not one per
    # unlock (issue 34), and the old one no longer opens the vault
    account = signup(served)
    vault_id = own_vault(served, account.token)
    device, other = new_device_id(), new_device_id()
    with account.client(served) as c:
        first = c.post("/account/keys", json={"vault_id": vault_id, "device_id": device}).json()
        elsewhere = c.post("/account/keys", json={"vault_id": vault_id, "device_id": other})
        second = c.post("/account/keys", json={"vault_id": vault_id, "device_id": device}).json()
        revoked = {k["id"]: k["revoked"] for k in c.get("/account").json()["keys"]}
    assert revoked == {first["id"]: True, elsewhere.json()["id"]: False, second["id"]: False}
    with client(served, first["key"]) as vault:
        assert_error(vault.get(f"/v1/vaults/{vault_id}/stats"), 401, "unauthorized")
    for key in (second["key"], elsewhere.json()["key"]):  # the honest case: both still work
        with client(served, key) as vault:
            assert vault.get(f"/v1/vaults/{vault_id}/stats").status_code == 200


def test_an_account_holds_a_bounded_number_of_keys(
    served: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every resource has a bound per account: past MAX_ACTIVE_KEYS unrevoked keys a mint is
    # 409 naming the bound and what to do; a device minting again still may (it replaces)
    monkeypatch.setattr(accounts_routes, "MAX_ACTIVE_KEYS", 3)
    account = signup(served)
    vault_id = own_vault(served, account.token)  # a wrap, no key yet
    device = new_device_id()
    with account.client(served) as c:
        body = {"vault_id": vault_id, "device_id": device}
        assert c.post("/account/keys", json=body).status_code == 200  # 1 of 3
        for _ in range(2):  # 2 and 3
            assert c.post("/account/keys", json={"vault_id": vault_id}).status_code == 200
        refused = c.post("/account/keys", json={"vault_id": vault_id})
        assert_error(refused, 409, "too_many_keys")
        assert "3 keys not revoked" in refused.json()["error"]
        assert c.post("/account/keys", json=body).status_code == 200  # replaces its own
        some = next(k for k in c.get("/account").json()["keys"] if not k["revoked"])
        assert c.delete(f"/account/keys/{some['id']}").status_code == 200
        assert c.post("/account/keys", json={"vault_id": vault_id}).status_code == 200
