"""Passkey wraps of passphrase vaults (relay/http/routes/vault_passkeys.py; docs/web-vault.md
"Passkey unlock", our addition to PROTOCOL §13): stored under a vault key's auth (PROTOCOL §10:
a key of that vault, device-bound or not; another vault's key 403), real client-side crypto (a
PRF output through HKDF into the wrap key, as web/js/passkey-crypto.js), opaque storage, the
cap of 10 per vault, and hostile bodies answered 4xx, never 500."""

from __future__ import annotations

import asyncio
import os
from datetime import datetime
from typing import Any

import asyncpg
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.store.vault_passkey_wraps import (
    MAX_PASSKEYS_PER_VAULT,
    TooManyPasskeysError,
    put,
)
from engram_sync.shared_format.b64 import b64decode_std, b64encode_std, b64url_encode
from engram_sync.shared_format.wraps import pack_vault_key, unpack_vault_key
from tests.relay.accounts.helpers import http, signup
from tests.relay.accounts.test_passkey_wraps import HOSTILE, credential, seal, wrap_key
from tests.relay.conftest import Relay
from tests.relay.support import assert_error, new_vault_id


def body(**changes: Any) -> dict[str, Any]:
    return {"wrapped_k": b64encode_std(bytes(93)), "prf_salt": b64encode_std(bytes(32)),
            **changes}  # fmt: skip


def path(vault_id: str, cred: str) -> str:
    return f"/v1/vaults/{vault_id}/passkeys/{cred}"


def test_a_vault_passkey_wrap_round_trips_and_after_removal_opens_nothing(served: Relay) -> None:
    vault_id = new_vault_id("vpk")
    key = served.mint(vault_id)
    cred = credential()
    prf_output, prf_salt = os.urandom(32), os.urandom(32)
    k = pack_vault_key(os.urandom(32), os.urandom(32), vault_id)
    wrapped = seal(wrap_key(prf_output, prf_salt), k)
    with http(served, key) as c:
        assert_error(c.get(path(vault_id, cred)), 404, "no_wrap")
        put = c.put(
            path(vault_id, cred), json=body(wrapped_k=wrapped, prf_salt=b64encode_std(prf_salt))
        )
        assert put.status_code == 200, put.text
        got = c.get(path(vault_id, cred)).json()
        assert (got["vault_id"], got["credential_id"], got["wrapped_k"]) == (
            vault_id,
            cred,
            wrapped,
        )
        raw = b64decode_std(got["wrapped_k"])
        key_bytes = wrap_key(prf_output, b64decode_std(got["prf_salt"]))
        opened = AESGCM(key_bytes).decrypt(raw[:12], raw[12:], None)
        assert unpack_vault_key(opened, vault_id).enc_key == k[:32]
        listed = c.get(f"/v1/vaults/{vault_id}/passkeys").json()
        assert [p["credential_id"] for p in listed["passkeys"]] == [cred]
        assert "wrapped_k" not in listed["passkeys"][0]  # a listing never hands out wraps
        gone = c.delete(path(vault_id, cred))
        assert gone.json() == {"vault_id": vault_id, "credential_id": cred, "deleted": True}
        assert_error(c.get(path(vault_id, cred)), 404, "no_wrap")
        assert c.delete(path(vault_id, cred)).json()["deleted"] is False
    assert not served.sql("SELECT 1 FROM vault_passkey_wraps WHERE credential_id = $1", cred)


def test_only_keys_of_the_vault_reach_its_wraps(served: Relay) -> None:
    vault_id, other_vault = new_vault_id("vpk"), new_vault_id("vpk-other")
    cred = credential()
    bound = served.mint(vault_id, device_id="browser-1")  # device-bound: its own vault only
    foreign = served.mint(other_vault)
    foreign_bound = served.mint(other_vault, device_id="browser-1")
    with http(served, bound) as c:
        assert c.put(path(vault_id, cred), json=body()).status_code == 200
        assert c.get(path(vault_id, cred)).status_code == 200
    for token in (foreign, foreign_bound):
        with http(served, token) as c:
            for method in ("PUT", "GET", "DELETE"):
                assert_error(c.request(method, path(vault_id, cred), json=body()), 403)
            assert_error(c.get(f"/v1/vaults/{vault_id}/passkeys"), 403)
            # its own vault holds no wrap under that credential: wraps never cross vaults
            assert_error(c.get(path(other_vault, cred)), 404, "no_wrap")
    with http(served) as anonymous:
        assert_error(anonymous.get(path(vault_id, cred)), 401)
        assert_error(anonymous.put(path(vault_id, cred), json=body()), 401)
    with http(served, signup(served).token) as session:  # a session is no vault key
        assert_error(session.get(path(vault_id, cred)), 401)
    assert served.sql("SELECT 1 FROM vault_passkey_wraps WHERE credential_id = $1", cred)


def test_caps_and_the_count_per_vault(served: Relay) -> None:
    vault_id = new_vault_id("vpk")
    key = served.mint(vault_id)
    for n in range(MAX_PASSKEYS_PER_VAULT):
        served.sql(
            "INSERT INTO vault_passkey_wraps (vault_id, credential_id, wrapped_k, prf_salt)"
            " VALUES ($1, $2, 'x', 'y')",
            vault_id,
            b64url_encode(bytes([n]) * 16),
        )
    with http(served, key) as c:
        big = body(wrapped_k=b64encode_std(bytes(513)))
        assert (
            assert_error(c.put(path(vault_id, credential()), json=big), 400)["field"] == "wrapped_k"
        )
        for salt in (bytes(15), bytes(65)):
            salty = body(prf_salt=b64encode_std(salt))
            error = assert_error(c.put(path(vault_id, credential()), json=salty), 400)
            assert error["field"] == "prf_salt"
        assert_error(c.put(path(vault_id, credential()), json=body()), 409, "too_many_passkeys")
        replaced = c.put(path(vault_id, b64url_encode(bytes(16))), json=body())
        assert replaced.status_code == 200  # a replacement fits
    other = new_vault_id("vpk")  # the cap is per vault
    with http(served, served.mint(other)) as c:
        assert c.put(path(other, credential()), json=body()).status_code == 200


def test_concurrent_adds_to_a_vault_without_a_row_keep_the_cap(served: Relay) -> None:
    """The cap holds when many adds race on a vault nobody has pushed to (no `vaults` row to
    lock): each add counts and writes under the vault's own advisory lock."""
    vault_id = new_vault_id("vpk")
    assert not served.sql("SELECT 1 FROM vaults WHERE vault_id = $1", vault_id)
    adds = MAX_PASSKEYS_PER_VAULT * 3

    async def race() -> list[object]:
        pool = await asyncpg.create_pool(to_libpq_url(served.database_url), min_size=adds,
                                         max_size=adds)  # fmt: skip
        try:
            return await asyncio.gather(
                *(
                    put(pool, vault_id, b64url_encode(bytes([n]) * 16), "w", "s")
                    for n in range(adds)
                ),
                return_exceptions=True,
            )
        finally:
            await pool.close()

    results = asyncio.run(race())
    refused = [r for r in results if isinstance(r, TooManyPasskeysError)]
    assert len(refused) == adds - MAX_PASSKEYS_PER_VAULT
    assert all(isinstance(r, datetime) for r in results if r not in refused)
    rows = served.sql("SELECT count(*) AS n FROM vault_passkey_wraps WHERE vault_id = $1", vault_id)
    assert rows[0]["n"] == MAX_PASSKEYS_PER_VAULT


@pytest.mark.parametrize("cred", ["AAAA=", "AB", "a+b/", "A" * 1366, "AAB", "%00", "AA%0A"])
def test_credential_ids_are_canonical_base64url(served: Relay, cred: str) -> None:
    vault_id = new_vault_id("vpk")
    with http(served, served.mint(vault_id)) as c:
        for method in ("GET", "PUT", "DELETE"):
            answer = c.request(method, f"/v1/vaults/{vault_id}/passkeys/{cred}", json=body())
            assert 400 <= answer.status_code < 500, answer.text


def test_hostile_bodies_are_refused_4xx_never_500(served: Relay) -> None:
    vault_id = new_vault_id("vpk")
    target = path(vault_id, credential())
    with http(served, served.mint(vault_id)) as c:
        for hostile in [*HOSTILE, {"wrapped_k": b64encode_std(bytes(93))}]:
            answer = c.put(target, json=hostile)
            assert answer.status_code < 500, (hostile, answer.text)
            if "password" not in (hostile if isinstance(hostile, dict) else {}):
                assert answer.status_code >= 400, hostile  # (a password is ignored here)
        for raw in (b"{", b"\xff\xfe", b"[" * 10000, b'{"prf_salt": "' + b"a" * 70000 + b'"}'):
            answer = c.put(target, content=raw, headers={"content-type": "application/json"})
            assert 400 <= answer.status_code < 500, answer.text
