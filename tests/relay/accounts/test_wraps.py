"""Key wraps (PROTOCOL §13): real client-side crypto, opaque storage, the password gate.

The "client" side wraps A under the password and K under A with shared_format;
the relay stores, returns and validates only the shape of what it cannot open.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from engram_sync.shared_format.b64 import b64decode_std, b64encode_std
from engram_sync.shared_format.wraps import (
    new_account_key,
    pack_vault_key,
    unwrap_vault_key,
    unwrap_with_secret,
    wrap_vault_key,
    wrap_with_secret,
)
from tests.relay.accounts.helpers import PASSWORD, Account, http, signin, signup
from tests.relay.conftest import Relay
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    new_vault_id,
    push_ok,
)

WRAP = b64encode_std(bytes(60))
SALT = b64encode_std(bytes(16))


def snapshot(relay: Relay, account: Account) -> list[Any]:
    """Everything stored about the account's wraps and login."""
    rows = relay.sql(
        "SELECT a.password_hash, w.* FROM accounts a LEFT JOIN account_wraps w"
        " ON w.account_id = a.id WHERE a.id = $1",
        account.account_id,
    )
    vaults = relay.sql(
        "SELECT vault_id, wrapped_k, updated_at FROM vault_wraps WHERE account_id = $1"
        " ORDER BY vault_id",
        account.account_id,
    )
    return [dict(r) for r in rows] + [dict(r) for r in vaults]


def test_wraps_round_trip_with_real_crypto(served: Relay) -> None:
    account = signup(served)
    a = new_account_key()
    wrapped_a, salt_pw = wrap_with_secret(a, PASSWORD)
    vault_id = new_vault_id("team")
    k = pack_vault_key(os.urandom(32), os.urandom(32), vault_id)
    wrapped_k = b64encode_std(wrap_vault_key(k, a))
    with account.client(served) as c:
        assert_error(c.get("/account/wraps/password"), 404, "no_wrap")
        assert c.get("/account/wraps").json() == {
            "wrapped_a": None,
            "salt_pw": None,
            "wrapped_a_rec": None,
            "salt_rec": None,
            "updated_at": None,
        }
        body = {
            "wrapped_a": b64encode_std(wrapped_a),
            "salt_pw": b64encode_std(salt_pw),
            "password": PASSWORD,
        }
        stored = c.put("/account/wraps/password", json=body)
        assert stored.status_code == 200, stored.text
        assert stored.json()["password_changed"] is False
        put_k = c.put(
            f"/account/vaults/{vault_id}/wrap", json={"wrapped_k": wrapped_k, "password": PASSWORD}
        )
        assert put_k.status_code == 200, put_k.text
        assert put_k.json()["vault_id"] == vault_id

    # A second device: sign in, fetch, unwrap A with the password, then K with A.
    token = signin(served, account.email, PASSWORD).json()["session_token"]
    with http(served, token) as c:
        fetched = c.get("/account/wraps/password").json()
        both = c.get("/account/wraps").json()
        fetched_k = c.get(f"/account/vaults/{vault_id}/wrap").json()
        assert c.get("/account").json()["vaults"] == [vault_id]
    assert both["wrapped_a"] == fetched["wrapped_a"]
    assert both["wrapped_a_rec"] is None
    opened_a = unwrap_with_secret(
        b64decode_std(fetched["wrapped_a"]), b64decode_std(fetched["salt_pw"]), PASSWORD
    )
    assert opened_a == a
    opened_k = unwrap_vault_key(b64decode_std(fetched_k["wrapped_k"]), opened_a, vault_id)
    assert (opened_k.enc_key, opened_k.hmac_key) == (k[:32], k[32:64])


def test_every_wrap_write_and_delete_needs_the_current_password(served: Relay) -> None:
    account = signup(served)
    vault_id = new_vault_id()
    with account.client(served) as c:
        ok = c.put(
            f"/account/vaults/{vault_id}/wrap", json={"wrapped_k": WRAP, "password": PASSWORD}
        )
        assert ok.status_code == 200, ok.text
        ok = c.put(
            "/account/wraps/password",
            json={"wrapped_a": WRAP, "salt_pw": SALT, "password": PASSWORD},
        )
        assert ok.status_code == 200, ok.text
    before = snapshot(served, account)
    wrong = PASSWORD + "?"
    other = b64encode_std(b"\x01" * 60)
    attempts = [
        (
            "PUT",
            "/account/wraps/password",
            {"wrapped_a": other, "salt_pw": SALT, "password": wrong},
        ),
        (
            "PUT",
            "/account/wraps/password",
            {"wrapped_a": other, "salt_pw": SALT, "password": wrong, "new_password": "x" * 12},
        ),
        (
            "PUT",
            "/account/wraps/recovery",
            {
                "wrapped_a_rec": other,
                "salt_rec": SALT,
                "recovery_verifier": b64encode_std(bytes(32)),
                "password": wrong,
            },
        ),
        ("PUT", f"/account/vaults/{vault_id}/wrap", {"wrapped_k": other, "password": wrong}),
        ("DELETE", f"/account/vaults/{vault_id}/wrap", {"password": wrong}),
        ("PUT", f"/account/vaults/{new_vault_id()}/wrap", {"wrapped_k": other, "password": wrong}),
    ]
    with account.client(served) as c:
        for method, path, body in attempts:
            assert_error(c.request(method, path, json=body), 403, "wrong_password")
        missing = c.request("DELETE", f"/account/vaults/{vault_id}/wrap", json={})
        assert assert_error(missing, 400, "invalid_request")["field"] == "password"
        no_body = c.request("DELETE", f"/account/vaults/{vault_id}/wrap")
        assert_error(no_body, 400, "malformed_json")
    assert snapshot(served, account) == before  # nothing changed
    assert signin(served, account.email, PASSWORD).status_code == 200

    with account.client(served) as c:
        gone = c.request("DELETE", f"/account/vaults/{vault_id}/wrap", json={"password": PASSWORD})
        assert gone.json() == {"vault_id": vault_id, "deleted": True}
        again = c.request("DELETE", f"/account/vaults/{vault_id}/wrap", json={"password": PASSWORD})
        assert again.json() == {"vault_id": vault_id, "deleted": False}
        assert_error(c.get(f"/account/vaults/{vault_id}/wrap"), 404, "no_wrap")


def test_password_checks_are_rate_limited_per_account(served: Relay) -> None:
    account = signup(served)
    body = {"wrapped_a": WRAP, "salt_pw": SALT, "password": "not the password"}
    with account.client(served) as c:
        codes = [c.put("/account/wraps/password", json=body).status_code for _ in range(11)]
    assert codes == [403] * 10 + [429]


@pytest.mark.parametrize(
    ("field", "value", "what"),
    [
        ("wrapped_a", "not base64!", "invalid character"),
        ("wrapped_a", "AAAA\n", "invalid character"),
        ("wrapped_a", "AAA", "multiple of 4"),
        ("wrapped_a", "AB==", "non-canonical"),
        ("wrapped_a", "-_-_" * 20, "invalid character"),  # base64url is not accepted here
        ("wrapped_a", b64encode_std(bytes(513)), "28..512"),
        ("wrapped_a", b64encode_std(bytes(8)), "28..512"),
        ("salt_pw", b64encode_std(bytes(65)), "16..64"),
        ("salt_pw", b64encode_std(bytes(15)), "16..64"),
        ("salt_pw", 16, "Expected `str`"),
    ],
)
def test_wraps_are_strict_base64_within_caps(
    served: Relay, field: str, value: object, what: str
) -> None:
    account = signup(served)
    body: dict[str, object] = {"wrapped_a": WRAP, "salt_pw": SALT, "password": PASSWORD}
    body[field] = value
    with account.client(served) as c:
        error = assert_error(c.put("/account/wraps/password", json=body), 400, "invalid_request")
    assert error["field"] == field
    assert what in error["error"]
    assert snapshot(served, account)[0]["wrapped_a"] is None


def test_wrap_caps_are_inclusive(served: Relay) -> None:
    account = signup(served)
    big = b64encode_std(bytes(512))
    salt = b64encode_std(bytes(64))
    with account.client(served) as c:
        r = c.put(
            "/account/wraps/password",
            json={"wrapped_a": big, "salt_pw": salt, "password": PASSWORD},
        )
        assert r.status_code == 200, r.text
        r = c.put(
            f"/account/vaults/{new_vault_id()}/wrap",
            json={"wrapped_k": b64encode_std(bytes(513)), "password": PASSWORD},
        )
        assert assert_error(r, 400, "invalid_request")["field"] == "wrapped_k"


def test_password_change_rewraps_and_ends_other_sessions(served: Relay) -> None:
    account = signup(served)
    other_session = signin(served, account.email, PASSWORD).json()["session_token"]
    new_password = "a much better passphrase"
    with account.client(served) as c:
        weak = c.put(
            "/account/wraps/password",
            json={
                "wrapped_a": WRAP,
                "salt_pw": SALT,
                "password": PASSWORD,
                "new_password": "short",
            },
        )
        assert assert_error(weak, 400, "weak_password")["field"] == "new_password"
        changed = c.put(
            "/account/wraps/password",
            json={
                "wrapped_a": WRAP,
                "salt_pw": SALT,
                "password": PASSWORD,
                "new_password": new_password,
            },
        )
        assert changed.status_code == 200, changed.text
        assert changed.json()["password_changed"] is True
        assert c.get("/account").status_code == 200  # this session stays
    with http(served, other_session) as c:
        assert_error(c.get("/account"), 401, "unauthorized")
    assert_error(signin(served, account.email, PASSWORD), 401, "invalid_credentials")
    assert signin(served, account.email, new_password).status_code == 200


def test_vault_ownership_claims_and_adoption(served: Relay) -> None:
    alice, bob = signup(served), signup(served)
    fresh = new_vault_id("owned")
    body = {"wrapped_k": WRAP, "password": PASSWORD}
    with alice.client(served) as c:
        assert c.put(f"/account/vaults/{fresh}/wrap", json=body).status_code == 200
        assert c.put(f"/account/vaults/{fresh}/wrap", json=body).status_code == 200  # update
    with bob.client(served) as c:
        assert_error(c.put(f"/account/vaults/{fresh}/wrap", json=body), 403, "vault_owned")

    # A vault with data pushed by other keys is not up for grabs either ...
    legacy = new_vault_id("legacy")
    with client(served) as operator:
        push_ok(operator, legacy, [Sealer(legacy).blob("m", 1)])
    member_key = served.mint(legacy)
    admin_key = served.mint(legacy, admin=True)
    with bob.client(served) as c:
        assert_error(c.put(f"/account/vaults/{legacy}/wrap", json=body), 403, "vault_owned")
        # ... unless an admin key for it vouches (adoption); a member key does not.
        weak = c.put(
            f"/account/vaults/{legacy}/wrap", json=body, headers={"X-Engram-Vault-Key": member_key}
        )
        assert_error(weak, 403)
        bogus = c.put(
            f"/account/vaults/{legacy}/wrap",
            json=body,
            headers={"X-Engram-Vault-Key": "en_not-a-key"},
        )
        assert_error(bogus, 403)
        adopted = c.put(
            f"/account/vaults/{legacy}/wrap", json=body, headers={"X-Engram-Vault-Key": admin_key}
        )
        assert adopted.status_code == 200, adopted.text
        assert legacy in c.get("/account").json()["vaults"]
        assert c.post("/account/keys", json={"vault_id": legacy}).status_code == 200
