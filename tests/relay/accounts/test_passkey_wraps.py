"""Passkey wraps of vault keys (relay/http/routes/passkeys.py; docs/web-vault.md "Passkey
unlock", our addition to PROTOCOL §13): real client-side crypto (a PRF output through HKDF into
the wrap key, as web/js/passkey-crypto.js), opaque storage, the rules of the other §13 wraps
(session, password in the body, caps, ownership), and hostile bodies answered 4xx, never 500."""

from __future__ import annotations

import os
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from engram_sync.relay.http.routes.passkeys import credential_problem
from engram_sync.relay.store.passkey_wraps import MAX_PASSKEYS_PER_VAULT
from engram_sync.shared_format.b64 import b64decode_std, b64encode_std, b64url_encode
from engram_sync.shared_format.wraps import pack_vault_key, unpack_vault_key
from tests.relay.accounts.helpers import PASSWORD, Account, http, signup
from tests.relay.conftest import ADMIN_KEY, Relay
from tests.relay.support import assert_error, new_vault_id

WRAP_INFO = b"engram-passkey-wrap-v1"


def wrap_key(prf_output: bytes, prf_salt: bytes) -> bytes:
    """What the page derives (web/js/passkey-crypto.js): HKDF-SHA256, salt = prf_salt."""
    return HKDF(hashes.SHA256(), 32, prf_salt, WRAP_INFO).derive(prf_output)


def seal(key: bytes, data: bytes) -> str:
    nonce = os.urandom(12)
    return b64encode_std(nonce + AESGCM(key).encrypt(nonce, data, None))


def owned_vault(account: Account, relay: Relay) -> str:
    """A vault the account owns (its first wrap claims it, PROTOCOL §13)."""
    vault_id = new_vault_id("pk")
    with account.client(relay) as c:
        put = c.put(
            f"/account/vaults/{vault_id}/wrap",
            json={"wrapped_k": b64encode_std(bytes(93)), "password": PASSWORD},
        )
    assert put.status_code == 200, put.text
    return vault_id


def credential() -> str:
    return b64url_encode(os.urandom(32))


def body(**changes: Any) -> dict[str, Any]:
    return {"wrapped_k": b64encode_std(bytes(93)), "prf_salt": b64encode_std(bytes(32)),
            "password": PASSWORD, **changes}  # fmt: skip


def test_a_passkey_wrap_round_trips_and_after_removal_opens_nothing(served: Relay) -> None:
    account = signup(served)
    vault_id = owned_vault(account, served)
    cred = credential()
    prf_output, prf_salt = os.urandom(32), os.urandom(32)
    k = pack_vault_key(os.urandom(32), os.urandom(32), vault_id)
    path = f"/account/vaults/{vault_id}/passkeys/{cred}"
    with account.client(served) as c:
        assert_error(c.get(path), 404, "no_wrap")
        wrapped = seal(wrap_key(prf_output, prf_salt), k)
        put = c.put(path, json=body(wrapped_k=wrapped, prf_salt=b64encode_std(prf_salt)))
        assert put.status_code == 200, put.text
        got = c.get(path).json()
        assert got["credential_id"] == cred
        assert got["wrapped_k"] == wrapped
        raw = b64decode_std(got["wrapped_k"])
        opened = AESGCM(wrap_key(prf_output, b64decode_std(got["prf_salt"]))).decrypt(
            raw[:12], raw[12:], None
        )
        assert unpack_vault_key(opened, vault_id).enc_key == k[:32]
        listed = c.get(f"/account/vaults/{vault_id}/passkeys").json()
        assert [p["credential_id"] for p in listed["passkeys"]] == [cred]
        assert "wrapped_k" not in listed["passkeys"][0]  # a listing never hands out wraps
        gone = c.request("DELETE", path, json={"password": PASSWORD})
        assert gone.json() == {"vault_id": vault_id, "credential_id": cred, "deleted": True}
        assert_error(c.get(path), 404, "no_wrap")
        again = c.request("DELETE", path, json={"password": PASSWORD})
        assert again.json()["deleted"] is False
    # stored: only opaque text (no PRF output, no wrap key, no K)
    (row,) = served.sql("SELECT count(*) AS n FROM passkey_wraps WHERE credential_id = $1", cred)
    assert row["n"] == 0


def test_sessions_passwords_and_ownership_are_required(served: Relay) -> None:
    owner, other = signup(served), signup(served)
    vault_id = owned_vault(owner, served)
    cred = credential()
    path = f"/account/vaults/{vault_id}/passkeys/{cred}"
    with http(served) as anonymous:
        assert_error(anonymous.put(path, json=body()), 401)
        assert_error(anonymous.get(path), 401)
    with http(served, ADMIN_KEY) as operator:  # API keys do not work on account routes
        assert_error(operator.put(path, json=body()), 401)
    with owner.client(served) as c:
        assert_error(c.put(path, json=body(password="wrong password!")), 403, "wrong_password")
        assert_error(c.get(path), 404, "no_wrap")  # nothing was stored
        assert c.put(path, json=body()).status_code == 200
        wrong = c.request("DELETE", path, json={"password": "wrong password!"})
        assert_error(wrong, 403, "wrong_password")
        assert c.get(path).status_code == 200  # still there
    with other.client(served) as c:
        # another account's vault: one answer for taken and foreign ids, never a claim
        assert_error(c.put(path, json=body()), 403, "vault_owned")
        unused = new_vault_id("pk-unused")
        assert_error(c.put(f"/account/vaults/{unused}/passkeys/{cred}", json=body()), 403)
        assert_error(c.get(path), 404, "no_wrap")  # the owner's wrap is not the other's
        gone = c.request("DELETE", path, json={"password": PASSWORD})
        assert gone.json()["deleted"] is False
    assert not served.sql("SELECT 1 FROM vault_owners WHERE vault_id = $1", unused)


def test_caps_and_the_count_per_vault(served: Relay) -> None:
    account = signup(served)
    vault_id = owned_vault(account, served)
    base = f"/account/vaults/{vault_id}/passkeys"
    for n in range(MAX_PASSKEYS_PER_VAULT):
        served.sql(
            "INSERT INTO passkey_wraps (account_id, vault_id, credential_id, wrapped_k, prf_salt)"
            " VALUES ($1, $2, $3, 'x', 'y')",
            account.account_id,
            vault_id,
            b64url_encode(bytes([n]) * 16),
        )
    with account.client(served) as c:
        big = b64encode_std(bytes(513))
        assert (
            assert_error(c.put(f"{base}/{credential()}", json=body(wrapped_k=big)), 400)["field"]
            == "wrapped_k"
        )
        for salt in (bytes(15), bytes(65)):
            error = assert_error(
                c.put(f"{base}/{credential()}", json=body(prf_salt=b64encode_std(salt))), 400
            )
            assert error["field"] == "prf_salt"
        assert_error(c.put(f"{base}/{credential()}", json=body()), 409, "too_many_passkeys")
        replaced = c.put(f"{base}/{b64url_encode(bytes(16))}", json=body())
        assert replaced.status_code == 200  # a replacement fits


@pytest.mark.parametrize(
    "cred",
    ["AAAA=", "AB", "a+b/", "A" * 1366, "AAB", "%00", "AA%0A"],
)
def test_credential_ids_are_canonical_base64url(served: Relay, cred: str) -> None:
    account = signup(served)
    with account.client(served) as c:
        answer = c.get(f"/account/vaults/v/passkeys/{cred}")
        assert 400 <= answer.status_code < 500, answer.text


def test_credential_problem_is_a_pure_rule() -> None:
    assert credential_problem(b64url_encode(os.urandom(1023))) is None
    assert credential_problem(b64url_encode(os.urandom(1024))) is not None
    assert credential_problem("AB") is not None  # non-zero trailing bits
    assert credential_problem("") is not None


HOSTILE: list[Any] = [
    None, [], "x", 1, {"wrapped_k": 1}, {"prf_salt": "AAAA"}, {**body(), "wrapped_k": None},
    {**body(), "password": ["p"]}, {**body(), "prf_salt": "not base64!"},
    {**body(), "extra": {"x": 1}},
]  # fmt: skip


def test_hostile_bodies_are_refused_4xx_never_500(served: Relay) -> None:
    account = signup(served)
    vault_id = owned_vault(account, served)
    path = f"/account/vaults/{vault_id}/passkeys/{credential()}"
    with account.client(served) as c:
        for hostile in HOSTILE:
            for method in ("PUT", "DELETE"):
                answer = c.request(method, path, json=hostile)
                assert answer.status_code < 500, (method, hostile, answer.text)
                if method == "PUT" and hostile != {**body(), "extra": {"x": 1}}:
                    assert answer.status_code >= 400, (method, hostile)
        for raw in (b"{", b"\xff\xfe", b"[" * 10000, b'{"password": "' + b"a" * 70000 + b'"}'):
            answer = c.put(path, content=raw, headers={"content-type": "application/json"})
            assert 400 <= answer.status_code < 500, answer.text


def test_closing_the_vault_removes_its_passkey_wraps(served: Relay) -> None:
    account = signup(served)
    vault_id = owned_vault(account, served)
    path = f"/account/vaults/{vault_id}/passkeys/{credential()}"
    with account.client(served) as c:
        assert c.put(path, json=body()).status_code == 200
        closed = c.request(
            "DELETE", f"/account/vaults/{vault_id}/wrap", json={"password": PASSWORD}
        )
        assert closed.json()["deleted"] is True
        assert_error(c.get(path), 404, "no_wrap")  # `vault close`: no passkey opens it either
