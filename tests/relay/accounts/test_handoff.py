"""Team key handoff (PROTOCOL §14) with real P-256/AES-GCM on both "client" sides.

The requester holds a member key but not K; an admin seals K to the requester's
ephemeral key after comparing fingerprints; the requester claims it exactly
once. Also: a relay that swaps in its own public key is caught by the
fingerprint comparison and cannot make the requester accept its seal.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import asyncpg
import httpx
import pytest

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.store import handoff
from engram_sync.relay.store.handoff import MAX_PENDING_PER_KEY, MAX_PENDING_PER_VAULT
from engram_sync.shared_format.b64 import b64url_encode
from engram_sync.shared_format.errors import HandoffError
from engram_sync.shared_format.handoff import (
    HandoffKeyPair,
    decode_public_key,
    new_handoff_keypair,
    open_handoff_wire,
    public_key_fingerprint,
    seal_vault_key,
)
from engram_sync.shared_format.handoff_pake import (
    RequesterPake,
    decode_pake_message,
    open_wire_with_code,
    pake_password,
    seal_vault_key_with_code,
)
from engram_sync.shared_format.pairing import parse_pairing_code
from engram_sync.shared_format.wraps import pack_vault_key
from tests.relay.accounts.helpers import http
from tests.relay.conftest import Relay
from tests.relay.support import assert_error, client, new_vault_id, wait_for_lock_waiters


def vault_key(vault_id: str) -> bytes:
    return pack_vault_key(os.urandom(32), os.urandom(32), vault_id)


def request_handoff(relay: Relay, vault_id: str, key: str, public_key: str) -> dict[str, Any]:
    with client(relay, key) as c:
        r = c.post(
            f"/v1/vaults/{vault_id}/handoff",
            json={"public_key": public_key, "label": "Bob's laptop"},
        )
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def status(relay: Relay, vault_id: str, key: str, request_id: str) -> str:
    with client(relay, key) as c:
        r = c.get(f"/v1/vaults/{vault_id}/handoff/{request_id}")
    assert r.status_code == 200, r.text
    value: str = r.json()["status"]
    return value


def seal(relay: Relay, vault_id: str, admin: str, request_id: str, wire: Any) -> httpx.Response:
    with client(relay, admin) as c:
        return c.post(f"/v1/vaults/{vault_id}/handoff/{request_id}/seal", json=wire)


def claim(relay: Relay, vault_id: str, key: str, request_id: str) -> httpx.Response:
    with client(relay, key) as c:
        return c.post(f"/v1/vaults/{vault_id}/handoff/{request_id}/claim")


def test_handoff_end_to_end(served: Relay) -> None:
    vault_id = new_vault_id("team")
    member, admin = served.mint(vault_id), served.mint(vault_id, admin=True)
    k = vault_key(vault_id)

    requester = new_handoff_keypair()
    created = request_handoff(served, vault_id, member, requester.public_key_b64url)
    assert created["fingerprint"] == requester.fingerprint  # what the requester's screen shows
    assert created["status"] == "pending"
    request_id = created["request_id"]
    assert status(served, vault_id, member, request_id) == "pending"
    assert_error(claim(served, vault_id, member, request_id), 409, "not_sealed_yet")

    with client(served, admin) as c:
        listed = c.get(f"/v1/vaults/{vault_id}/handoff").json()
    assert listed["vault_id"] == vault_id
    [pending] = listed["requests"]
    assert (pending["request_id"], pending["label"]) == (request_id, "Bob's laptop")
    # The admin compares the fingerprint with the requester's screen, then seals to that key.
    assert (
        public_key_fingerprint(decode_public_key(pending["public_key"])) == pending["fingerprint"]
    )
    assert pending["fingerprint"] == requester.fingerprint
    sealed = seal_vault_key(decode_public_key(pending["public_key"]), k)
    done = seal(served, vault_id, admin, request_id, sealed.to_wire())
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "sealed"
    assert_error(seal(served, vault_id, admin, request_id, sealed.to_wire()), 409, "already_sealed")
    assert status(served, vault_id, member, request_id) == "sealed"
    with client(served, admin) as c:
        assert c.get(f"/v1/vaults/{vault_id}/handoff").json()["requests"] == []

    got = claim(served, vault_id, member, request_id)
    assert got.status_code == 200, got.text
    opened = open_handoff_wire(requester, got.json()["public_key"], got.json()["sealed"], vault_id)
    assert (opened.enc_key, opened.hmac_key, opened.vault_id) == (k[:32], k[32:64], vault_id)
    assert_error(claim(served, vault_id, member, request_id), 410, "already_claimed")
    assert status(served, vault_id, admin, request_id) == "claimed"
    row = served.sql(
        "SELECT sealed IS NULL AS gone, admin_public_key IS NULL AS pk_gone, claimed_at"
        " FROM handoff_requests WHERE request_id = $1",
        request_id,
    )
    assert (row[0]["gone"], row[0]["pk_gone"]) == (True, True)
    assert row[0]["claimed_at"] is not None


def test_fifty_concurrent_claims_one_winner(served: Relay) -> None:
    vault_id = new_vault_id("race")
    member, admin = served.mint(vault_id), served.mint(vault_id, admin=True)
    requester = new_handoff_keypair()
    request_id = request_handoff(served, vault_id, member, requester.public_key_b64url)[
        "request_id"
    ]
    sealed = seal_vault_key(requester.public_key, vault_key(vault_id))
    assert seal(served, vault_id, admin, request_id, sealed.to_wire()).status_code == 200

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(lambda _: claim(served, vault_id, member, request_id), range(50)))
    winners = [r for r in answers if r.status_code == 200]
    assert len(winners) == 1, sorted(r.status_code for r in answers)
    for loser in answers:
        if loser.status_code != 200:
            assert_error(loser, 410, "already_claimed")
    assert winners[0].json()["sealed"]
    open_handoff_wire(
        requester, winners[0].json()["public_key"], winners[0].json()["sealed"], vault_id
    )
    row = served.sql(
        "SELECT sealed IS NULL AS sealed_gone, admin_public_key IS NULL AS key_gone"
        " FROM handoff_requests WHERE vault_id = $1 AND request_id = $2",
        vault_id,
        request_id,
    )
    assert [tuple(r) for r in row] == [(True, True)]


CLAIMERS = 20


def test_concurrent_claims_at_the_store_have_one_winner(served: Relay) -> None:
    """CLAIMERS connections call `relay.store.handoff.claim` on one seal at the same moment.

    A gate makes the race exact: the test holds FOR SHARE on the request's row, which lets
    every claimer read it but not change it, and opens only once all CLAIMERS wait on that
    lock; so a claim that reads the seal and then erases it (check-then-act) hands it to
    every claimer. Fails every run (5 of 5) with `claim` made check-then-act."""
    vault_id = new_vault_id("gate")
    member, admin = served.mint(vault_id), served.mint(vault_id, admin=True)
    requester = new_handoff_keypair()
    request_id = request_handoff(served, vault_id, member, requester.public_key_b64url)[
        "request_id"
    ]
    sealed = seal_vault_key(requester.public_key, vault_key(vault_id))
    assert seal(served, vault_id, admin, request_id, sealed.to_wire()).status_code == 200
    (row,) = served.sql(
        "SELECT requester_key_id FROM handoff_requests WHERE request_id = $1", request_id
    )
    name = f"claim-{request_id}"

    async def race() -> list[handoff.ClaimedSeal | None]:
        url = to_libpq_url(served.database_url)
        gate = await asyncpg.connect(url)
        pool = await asyncpg.create_pool(
            url,
            min_size=CLAIMERS,
            max_size=CLAIMERS,
            server_settings={"application_name": name},
        )
        try:
            async with gate.transaction():
                await gate.execute(  # by vault too: one shard on Citus
                    "SELECT 1 FROM handoff_requests WHERE vault_id = $1 AND request_id = $2"
                    " FOR SHARE",
                    vault_id,
                    request_id,
                )
                claims = [
                    asyncio.ensure_future(
                        handoff.claim(pool, vault_id, request_id, row["requester_key_id"])
                    )
                    for _ in range(CLAIMERS)
                ]
                await wait_for_lock_waiters(gate, name, CLAIMERS)
            return await asyncio.gather(*claims)
        finally:
            await pool.close()
            await gate.close()

    answers = asyncio.run(race())
    winners = [a for a in answers if a is not None]
    assert len(winners) == 1, f"{len(winners)} of {CLAIMERS} claims got the seal"
    # The positive case: the one winner got the seal the admin made, and it opens.
    wire = sealed.to_wire()
    assert (winners[0].admin_public_key, winners[0].sealed) == (wire["public_key"], wire["sealed"])
    open_handoff_wire(requester, winners[0].admin_public_key, winners[0].sealed, vault_id)
    assert status(served, vault_id, member, request_id) == "claimed"
    gone = served.sql("SELECT sealed FROM handoff_requests WHERE request_id = $1", request_id)
    assert [r["sealed"] for r in gone] == [None]


def test_expired_request_is_refused_and_its_seal_erased(served: Relay) -> None:
    vault_id = new_vault_id("exp")
    member, admin = served.mint(vault_id), served.mint(vault_id, admin=True)
    requester = new_handoff_keypair()
    sealed_id = request_handoff(served, vault_id, member, requester.public_key_b64url)["request_id"]
    pending_id = request_handoff(served, vault_id, member, requester.public_key_b64url)[
        "request_id"
    ]
    wire = seal_vault_key(requester.public_key, vault_key(vault_id)).to_wire()
    assert seal(served, vault_id, admin, sealed_id, wire).status_code == 200
    served.sql(
        "UPDATE handoff_requests SET expires_at = now() - interval '1 minute' WHERE vault_id = $1",
        vault_id,
    )
    assert_error(claim(served, vault_id, member, sealed_id), 410, "expired")
    assert_error(seal(served, vault_id, admin, pending_id, wire), 410, "expired")
    assert status(served, vault_id, member, sealed_id) == "expired"
    with client(served, admin) as c:
        assert c.get(f"/v1/vaults/{vault_id}/handoff").json()["requests"] == []
    rows = served.sql(
        "SELECT sealed, admin_public_key FROM handoff_requests WHERE vault_id = $1", vault_id
    )
    assert [tuple(r) for r in rows] == [(None, None), (None, None)]  # the seal is gone
    # A day later the rows themselves go.
    served.sql(
        "UPDATE handoff_requests SET expires_at = now() - interval '25 hours' WHERE vault_id = $1",
        vault_id,
    )
    with client(served, member) as c:
        assert_error(c.get(f"/v1/vaults/{vault_id}/handoff/{sealed_id}"), 404, "handoff_not_found")
    assert served.sql("SELECT * FROM handoff_requests WHERE vault_id = $1", vault_id) == []


def test_substituted_public_key_is_detectable_and_useless(served: Relay) -> None:
    vault_id = new_vault_id("mitm")
    member, admin = served.mint(vault_id), served.mint(vault_id, admin=True)
    requester, attacker = new_handoff_keypair(), new_handoff_keypair()
    created = request_handoff(served, vault_id, member, requester.public_key_b64url)
    shown_to_requester = created["fingerprint"]
    # A malicious relay (here: direct SQL) swaps in its own key.
    served.sql(
        "UPDATE handoff_requests SET public_key = $1 WHERE request_id = $2",
        attacker.public_key_b64url,
        created["request_id"],
    )
    with client(served, admin) as c:
        [pending] = c.get(f"/v1/vaults/{vault_id}/handoff").json()["requests"]
    # The listing's fingerprint is computed from the key the admin would seal to, so the
    # admin's comparison with the requester's screen fails: the swap is detectable.
    assert pending["fingerprint"] != shown_to_requester
    assert pending["fingerprint"] == attacker.fingerprint
    with client(served, member) as c:
        assert (
            c.get(f"/v1/vaults/{vault_id}/handoff/{created['request_id']}").json()["fingerprint"]
            == attacker.fingerprint
        )
    # An admin who sealed anyway: the requester cannot open it (and would notice).
    k = vault_key(vault_id)
    wire = seal_vault_key(decode_public_key(pending["public_key"]), k).to_wire()
    assert seal(served, vault_id, admin, created["request_id"], wire).status_code == 200
    got = claim(served, vault_id, member, created["request_id"]).json()
    with pytest.raises(HandoffError):
        open_handoff_wire(requester, got["public_key"], got["sealed"], vault_id)
    # (whereas the attacker's key would open it: why the fingerprint check matters)
    assert open_handoff_wire(attacker, got["public_key"], got["sealed"], vault_id).enc_key == k[:32]


def test_only_the_requesting_key_claims_and_sees_it(served: Relay) -> None:
    vault_id = new_vault_id("who")
    member, other_member = served.mint(vault_id), served.mint(vault_id)
    admin = served.mint(vault_id, admin=True)
    requester = new_handoff_keypair()
    request_id = request_handoff(served, vault_id, member, requester.public_key_b64url)[
        "request_id"
    ]
    wire = seal_vault_key(requester.public_key, vault_key(vault_id)).to_wire()
    assert seal(served, vault_id, admin, request_id, wire).status_code == 200
    assert_error(claim(served, vault_id, other_member, request_id), 403)
    assert_error(claim(served, vault_id, admin, request_id), 403)
    with client(served, other_member) as c:
        assert_error(c.get(f"/v1/vaults/{vault_id}/handoff/{request_id}"), 403)
        assert_error(c.delete(f"/v1/vaults/{vault_id}/handoff/{request_id}"), 403)
    assert status(served, vault_id, member, request_id) == "sealed"  # nothing was taken
    assert_error(claim(served, vault_id, member, "ho_nope"), 404, "handoff_not_found")
    with client(served, member) as c:
        cancelled = c.delete(f"/v1/vaults/{vault_id}/handoff/{request_id}")
        assert cancelled.json() == {"request_id": request_id, "vault_id": vault_id, "deleted": True}
    assert served.sql("SELECT * FROM handoff_requests WHERE request_id = $1", request_id) == []


def post_handoff(relay: Relay, vault_id: str, key: str) -> httpx.Response:
    with client(relay, key) as c:
        return c.post(
            f"/v1/vaults/{vault_id}/handoff",
            json={"public_key": new_handoff_keypair().public_key_b64url, "label": "laptop"},
        )


def test_one_key_at_its_limit_does_not_block_another_keys_request(served: Relay) -> None:
    # PROTOCOL §14: open requests are limited per requesting key, not per vault.
    vault_id = new_vault_id("queue")
    greedy, newcomer = served.mint(vault_id), served.mint(vault_id)
    admin = served.mint(vault_id, admin=True)
    for _ in range(MAX_PENDING_PER_KEY):
        assert post_handoff(served, vault_id, greedy).status_code == 200
    refused = assert_error(post_handoff(served, vault_id, greedy), 409, "too_many_handoffs")
    assert "this key already has" in str(refused["error"])
    assert post_handoff(served, vault_id, newcomer).status_code == 200
    with client(served, admin) as c:
        listed = c.get(f"/v1/vaults/{vault_id}/handoff").json()["requests"]
    assert len(listed) == MAX_PENDING_PER_KEY + 1
    # A claimed, cancelled or expired request frees the key's slot.
    with client(served, greedy) as c:
        c.delete(f"/v1/vaults/{vault_id}/handoff/{listed[0]['request_id']}")
    served.sql(
        "UPDATE handoff_requests SET expires_at = now() - interval '1 second'"
        " WHERE request_id = $1",
        listed[1]["request_id"],
    )
    for _ in range(2):
        assert post_handoff(served, vault_id, greedy).status_code == 200
    assert_error(post_handoff(served, vault_id, greedy), 409, "too_many_handoffs")


def test_the_vault_keeps_a_generous_bound_as_a_safety_net(served: Relay) -> None:
    vault_id = new_vault_id("net")
    public_key = new_handoff_keypair().public_key_b64url
    served.sql(
        "INSERT INTO handoff_requests (vault_id, request_id, public_key, requester_key_id,"
        " expires_at) SELECT $1, 'ho_fill' || g, $2, 'k_fill' || g, now() + interval '1 hour'"
        " FROM generate_series(1, $3::int) g",
        vault_id,
        public_key,
        MAX_PENDING_PER_VAULT,
    )
    refused = assert_error(post_handoff(served, vault_id, served.mint(vault_id)), 409)
    assert refused["code"] == "too_many_handoffs"
    assert "this vault already has" in str(refused["error"])
    other = new_vault_id("net")
    assert post_handoff(served, other, served.mint(other)).status_code == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"public_key": "not*base64url"}, "public_key"),
        ({"public_key": "AAAA"}, "public_key"),  # 3 bytes
        ({"public_key": "BA" + "A" * 85}, "public_key"),  # 65 bytes, 0x04..., not on the curve
        ({"label": "x"}, "public_key"),
        ({"public_key": 7}, "public_key"),
    ],
)
def test_request_validation(served: Relay, body: dict[str, object], field: str) -> None:
    vault_id = new_vault_id("val")
    with client(served, served.mint(vault_id)) as c:
        response = c.post(f"/v1/vaults/{vault_id}/handoff", json=body)
    assert assert_error(response, 400)["field"] == field


def test_seal_validation(served: Relay) -> None:
    vault_id = new_vault_id("val")
    member, admin = served.mint(vault_id), served.mint(vault_id, admin=True)
    requester = new_handoff_keypair()
    request_id = request_handoff(served, vault_id, member, requester.public_key_b64url)[
        "request_id"
    ]
    good = seal_vault_key(requester.public_key, vault_key(vault_id)).to_wire()
    for bad, field in [
        ({**good, "sealed": good["sealed"][:40]}, "sealed"),  # shorter than any K
        ({**good, "sealed": good["sealed"] + "="}, "sealed"),  # padding is not base64url
        ({**good, "public_key": requester.public_key_b64url[:-2]}, "public_key"),
    ]:
        assert assert_error(seal(served, vault_id, admin, request_id, bad), 400)["field"] == field
    assert status(served, vault_id, member, request_id) == "pending"
    assert_error(seal(served, vault_id, admin, "ho_missing", good), 404, "handoff_not_found")


def test_public_key_round_trips_and_the_fingerprint_is_not_stored(served: Relay) -> None:
    vault_id = new_vault_id("fp")
    requester = new_handoff_keypair()
    created = request_handoff(served, vault_id, served.mint(vault_id), requester.public_key_b64url)
    columns = served.sql(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'handoff_requests'"
    )
    assert "fingerprint" not in {c["column_name"] for c in columns}
    stored = served.sql(
        "SELECT public_key FROM handoff_requests WHERE request_id = $1", created["request_id"]
    )
    assert stored[0]["public_key"] == requester.public_key_b64url
    with http(served) as anonymous:
        assert_error(anonymous.get(f"/v1/vaults/{vault_id}/handoff"), 401, "unauthorized")


# --- PROTOCOL §14 step 4: the pairing-code fields ------------------------------------


CODE = parse_pairing_code("ENG-7K3M-Q9XA-D2PF-ABCD-EFGH")


def request_with_code(
    relay: Relay, vault_id: str, key: str, keypair: HandoffKeyPair, pake: RequesterPake
) -> dict[str, Any]:
    with client(relay, key) as c:
        r = c.post(
            f"/v1/vaults/{vault_id}/handoff",
            json={
                "public_key": keypair.public_key_b64url,
                "label": "Bob's laptop",
                "pake": b64url_encode(pake.message),
                "pairing_id": CODE.pairing_id,
            },
        )
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_pairing_code_handoff_through_the_relay(served: Relay) -> None:
    vault_id = new_vault_id("pake")
    member, admin = served.mint(vault_id), served.mint(vault_id, admin=True)
    k = vault_key(vault_id)
    requester, pake = new_handoff_keypair(), RequesterPake.start(pake_password(CODE))
    request_id = request_with_code(served, vault_id, member, requester, pake)["request_id"]

    with client(served, admin) as c:
        [pending] = c.get(f"/v1/vaults/{vault_id}/handoff").json()["requests"]
    assert pending["pake"] == b64url_encode(pake.message)
    assert pending["pairing_id"] == CODE.pairing_id
    made = seal_vault_key_with_code(
        pake_password(CODE),
        request_id,
        decode_public_key(pending["public_key"]),
        decode_pake_message(pending["pake"], b"B"),
        k,
    )
    # A seal without the exchange is refused for this request (and the request stays open).
    plain = seal_vault_key(requester.public_key, k).to_wire()
    assert assert_error(seal(served, vault_id, admin, request_id, plain), 400)["field"] == "pake"
    assert status(served, vault_id, member, request_id) == "pending"
    done = seal(served, vault_id, admin, request_id, made.to_wire())
    assert done.status_code == 200, done.text

    got = claim(served, vault_id, member, request_id)
    assert got.status_code == 200, got.text
    wire = got.json()
    assert set(wire) >= {"public_key", "sealed", "pake", "auth"}
    key = open_wire_with_code(
        RequesterPake.from_state(pake.state()), requester, request_id, wire, vault_id
    )
    assert key.enc_key == k[:32]
    rows = served.sql(
        "SELECT sealed, admin_public_key, admin_pake, seal_auth FROM handoff_requests"
        " WHERE request_id = $1",
        request_id,
    )
    assert [tuple(r) for r in rows] == [(None, None, None, None)]  # erased with the claim


def test_member_requests_have_no_pairing_fields_and_refuse_them_in_a_seal(served: Relay) -> None:
    vault_id = new_vault_id("nopake")
    member, admin = served.mint(vault_id), served.mint(vault_id, admin=True)
    requester = new_handoff_keypair()
    request_id = request_handoff(served, vault_id, member, requester.public_key_b64url)[
        "request_id"
    ]
    with client(served, admin) as c:
        [pending] = c.get(f"/v1/vaults/{vault_id}/handoff").json()["requests"]
    assert "pake" not in pending
    assert "pairing_id" not in pending
    pake = RequesterPake.start(pake_password(CODE))
    made = seal_vault_key_with_code(
        pake_password(CODE), request_id, requester.public_key, pake.message, vault_key(vault_id)
    )
    assert (
        assert_error(seal(served, vault_id, admin, request_id, made.to_wire()), 400)["field"]
        == "pake"
    )
    plain = seal_vault_key(requester.public_key, vault_key(vault_id))
    assert seal(served, vault_id, admin, request_id, plain.to_wire()).status_code == 200
    got = claim(served, vault_id, member, request_id).json()
    assert "pake" not in got
    assert "auth" not in got


def test_pairing_field_validation(served: Relay) -> None:
    vault_id = new_vault_id("val")
    member, admin = served.mint(vault_id), served.mint(vault_id, admin=True)
    requester = new_handoff_keypair()
    pake = RequesterPake.start(pake_password(CODE))
    good = {
        "public_key": requester.public_key_b64url,
        "pake": b64url_encode(pake.message),
        "pairing_id": CODE.pairing_id,
    }
    admin_side = seal_vault_key_with_code(
        pake_password(CODE), "ho_x", requester.public_key, pake.message, vault_key(vault_id)
    ).to_wire()
    with client(served, member) as c:
        for bad, field in [
            ({**good, "pake": None}, "pake"),
            ({k: v for k, v in good.items() if k != "pake"}, "pake"),
            ({k: v for k, v in good.items() if k != "pairing_id"}, "pairing_id"),
            ({**good, "pairing_id": CODE.pairing_id.upper()}, "pairing_id"),
            ({**good, "pairing_id": CODE.full}, "pairing_id"),  # never the code itself
            ({**good, "pake": admin_side["pake"]}, "pake"),  # side A where B is expected
            ({**good, "pake": good["pake"][:-4]}, "pake"),
        ]:
            response = c.post(f"/v1/vaults/{vault_id}/handoff", json=bad)
            assert assert_error(response, 400)["field"] == field, bad
    request_id = request_with_code(served, vault_id, member, requester, pake)["request_id"]
    for bad, field in [
        ({k: v for k, v in admin_side.items() if k != "auth"}, "auth"),
        ({k: v for k, v in admin_side.items() if k != "pake"}, "pake"),
        ({**admin_side, "pake": good["pake"]}, "pake"),  # side B where A is expected
        ({**admin_side, "auth": admin_side["auth"][:-2]}, "auth"),
    ]:
        assert assert_error(seal(served, vault_id, admin, request_id, bad), 400)["field"] == field
    assert status(served, vault_id, member, request_id) == "pending"


def test_expiry_erases_the_exchange_of_the_seal(served: Relay) -> None:
    vault_id = new_vault_id("pexp")
    member, admin = served.mint(vault_id), served.mint(vault_id, admin=True)
    requester, pake = new_handoff_keypair(), RequesterPake.start(pake_password(CODE))
    request_id = request_with_code(served, vault_id, member, requester, pake)["request_id"]
    made = seal_vault_key_with_code(
        pake_password(CODE), request_id, requester.public_key, pake.message, vault_key(vault_id)
    )
    assert seal(served, vault_id, admin, request_id, made.to_wire()).status_code == 200
    served.sql(
        "UPDATE handoff_requests SET expires_at = now() - interval '1 minute' WHERE vault_id = $1",
        vault_id,
    )
    assert_error(claim(served, vault_id, member, request_id), 410, "expired")
    rows = served.sql(
        "SELECT sealed, admin_pake, seal_auth FROM handoff_requests WHERE vault_id = $1", vault_id
    )
    assert [tuple(r) for r in rows] == [(None, None, None)]


def test_schema_keeps_the_pairs_together(served: Relay) -> None:
    """0005's constraints: the request's pair, the seal's pair, and a seal's exchange only
    with a seal of a pairing-code request."""
    vault_id = new_vault_id("chk")
    member = served.mint(vault_id)
    requester = new_handoff_keypair()
    request_id = request_handoff(served, vault_id, member, requester.public_key_b64url)[
        "request_id"
    ]
    for statement in [
        "UPDATE handoff_requests SET requester_pake = 'x' WHERE request_id = $1",
        "UPDATE handoff_requests SET admin_pake = 'x', seal_auth = 'y' WHERE request_id = $1",
        "UPDATE handoff_requests SET pairing_id = 'NOT-HEX', requester_pake = 'x'"
        " WHERE request_id = $1",
    ]:
        with pytest.raises(asyncpg.CheckViolationError):
            served.sql(statement, request_id)
