"""Zero knowledge of the account layer: after a full run of signup, wraps, recovery,
pairing and handoff, no column of any table holds the password, A, K, the recovery
phrase, a session token, a pairing code or an API key — in any usual spelling.
"""

from __future__ import annotations

import base64
import os

import asyncpg

from engram_sync.shared_format.b64 import b64decode_std, b64encode_std
from engram_sync.shared_format.handoff import (
    decode_public_key,
    new_handoff_keypair,
    open_handoff_wire,
    seal_vault_key,
)
from engram_sync.shared_format.recovery import generate_recovery_phrase
from engram_sync.shared_format.recovery_proof import open_recovery_wrap, wrap_for_recovery
from engram_sync.shared_format.wraps import (
    new_account_key,
    pack_vault_key,
    wrap_vault_key,
    wrap_with_secret,
)
from tests.relay.accounts.helpers import http, signin, signup
from tests.relay.conftest import Relay
from tests.relay.support import client, new_device_id, new_vault_id, run_db

PASSWORD = "zero-knowledge canary password 7f3a"
NEW_PASSWORD = "zero-knowledge canary password 2 9c1e"


def dump_every_column(relay: Relay) -> str:
    """Every row of every table in the public schema, each cast to text."""

    async def work(conn: asyncpg.Connection) -> str:
        tables = await conn.fetch(
            "SELECT quote_ident(table_name) AS name FROM information_schema.tables"
            " WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1"
        )
        lines: list[str] = []
        for table in tables:
            rows = await conn.fetch(f"SELECT t::text AS row FROM {table['name']} t")
            lines.extend(f"{table['name']}: {r['row']}" for r in rows)
        return "\n".join(lines)

    return run_db(relay.database_url, work)


def spellings(secret: bytes) -> list[str]:
    """The ways raw key material could be written down (and a 16-byte window of it)."""
    out: list[str] = []
    for chunk in (secret, secret[:16], secret[-16:]):
        out += [
            chunk.hex(),
            chunk.hex().upper(),
            base64.b64encode(chunk).decode().rstrip("="),
            base64.urlsafe_b64encode(chunk).decode().rstrip("="),
            "\\\\x" + chunk.hex(),  # bytea text output
        ]
    return out


def test_database_holds_no_secret_after_a_full_run(relay: Relay) -> None:
    account = signup(relay, password=PASSWORD)
    a = new_account_key()
    phrase = generate_recovery_phrase()
    vault_id = new_vault_id("zk")
    k = pack_vault_key(os.urandom(32), os.urandom(32), vault_id)
    wrapped_a, salt_pw = wrap_with_secret(a, PASSWORD)
    rec = wrap_for_recovery(a, phrase)
    with account.client(relay) as c:
        for path, body in [
            (
                "/account/wraps/password",
                {"wrapped_a": b64encode_std(wrapped_a), "salt_pw": b64encode_std(salt_pw)},
            ),
            ("/account/wraps/recovery", rec.wire()),
            (
                f"/account/vaults/{vault_id}/wrap",
                {"wrapped_k": b64encode_std(wrap_vault_key(k, a))},
            ),
        ]:
            assert c.put(path, json={**body, "password": PASSWORD}).status_code == 200
        owner_key = c.post("/account/keys", json={"vault_id": vault_id}).json()["key"]
        code = c.post(f"/v1/vaults/{vault_id}/pairing-codes").json()["code"]
    with http(relay) as c:
        paired = c.post("/pair/redeem", json={"code": code, "device_id": new_device_id()}).json()
        start = c.post("/auth/recover/start", json={"email": account.email}).json()
        _, proof = open_recovery_wrap(
            b64decode_std(start["wrapped_a_rec"]), b64decode_std(start["salt_rec"]), phrase
        )
        new_wrap, new_salt = wrap_with_secret(a, NEW_PASSWORD)
        recovered = c.post(
            "/auth/recover",
            json={
                "email": account.email,
                "proof": b64encode_std(proof),
                "new_password": NEW_PASSWORD,
                "wrapped_a": b64encode_std(new_wrap),
                "salt_pw": b64encode_std(new_salt),
            },
        )
        assert recovered.status_code == 200, recovered.text
    session = signin(relay, account.email, NEW_PASSWORD).json()["session_token"]

    requester = new_handoff_keypair()
    with client(relay, paired["api_key"]) as c:
        request_id = c.post(
            f"/v1/vaults/{vault_id}/handoff", json={"public_key": requester.public_key_b64url}
        ).json()["request_id"]
    with client(relay, owner_key) as c:
        [pending] = c.get(f"/v1/vaults/{vault_id}/handoff").json()["requests"]
        wire = seal_vault_key(decode_public_key(pending["public_key"]), k).to_wire()
        assert (
            c.post(f"/v1/vaults/{vault_id}/handoff/{request_id}/seal", json=wire).status_code == 200
        )
    # A second request stays sealed and unclaimed: ciphertext of K at rest, K itself never.
    second = new_handoff_keypair()
    with client(relay, paired["api_key"]) as c:
        second_id = c.post(
            f"/v1/vaults/{vault_id}/handoff", json={"public_key": second.public_key_b64url}
        ).json()["request_id"]
    with client(relay, owner_key) as c:
        wire2 = seal_vault_key(second.public_key, k).to_wire()
        assert (
            c.post(f"/v1/vaults/{vault_id}/handoff/{second_id}/seal", json=wire2).status_code == 200
        )
    with client(relay, paired["api_key"]) as c:
        got = c.post(f"/v1/vaults/{vault_id}/handoff/{request_id}/claim").json()
    assert (
        open_handoff_wire(requester, got["public_key"], got["sealed"], vault_id).enc_key == k[:32]
    )

    dump = dump_every_column(relay)
    # Positive controls: the search looks at the right data.
    assert b64encode_std(new_wrap) in dump
    assert rec.wire()["wrapped_a_rec"] in dump
    assert wire2["sealed"] in dump
    assert account.account_id in dump
    # Nothing secret, in any spelling.
    texts = [
        PASSWORD,
        NEW_PASSWORD,
        phrase,
        phrase.split()[0] + " " + phrase.split()[1] + " " + phrase.split()[2],
        account.token,
        session,
        code,
        code.replace("-", ""),
        owner_key,
        paired["api_key"],
        b64encode_std(proof),
    ]
    texts += (
        spellings(a) + spellings(k[:32]) + spellings(k[32:64]) + spellings(k) + spellings(proof)
    )
    found = [t for t in texts if t in dump or t.lower() in dump.lower()]
    assert found == []
