"""Pairing codes: issue, redeem exactly once, expire, and the `engram-relay pair` command."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from engram_sync.shared_format.pairing import (
    PairingCodeError,
    normalize_pairing_code,
    pairing_code_hash,
)
from tests.relay.accounts.helpers import PASSWORD, Account, http, signup
from tests.relay.conftest import ADMIN_KEY, Relay
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    new_device_id,
    new_vault_id,
    pull_ok,
    push_ok,
)

CODE = re.compile(r"ENG-[0-9A-HJKMNP-TV-Z]{4}-[0-9A-HJKMNP-TV-Z]{4}-[0-9A-HJKMNP-TV-Z]{4}")


def issue(relay: Relay, vault_id: str, key: str = ADMIN_KEY, **body: object) -> httpx.Response:
    """POST a pairing code request for the vault with `key` (an API key or a session token)."""
    with http(relay, key) as c:
        return c.post(f"/v1/vaults/{vault_id}/pairing-codes", json=body or None)


def redeem(relay: Relay, code: str, device_id: str, label: str | None = "laptop") -> httpx.Response:
    """Redeem from a fresh address."""
    with http(relay) as c:
        return c.post("/pair/redeem", json={"code": code, "device_id": device_id, "label": label})


def test_code_format_and_normalisation() -> None:
    code = "ENG-7K3M-Q9XA-D2PF"
    assert normalize_pairing_code(" eng 7k3m q9xa d2pf ") == code
    assert normalize_pairing_code("7K3MQ9XAD2PF") == code
    assert normalize_pairing_code("eng-iLoo-oooo-oooo") == "ENG-1100-0000-0000"  # look-alikes
    assert pairing_code_hash("eng-7k3m-q9xa-d2pf") == hashlib.sha256(code.encode()).digest()
    for bad in ("ENG-7K3M-Q9XA", "ENG-7K3M-Q9XA-D2PU", "ENG-7K3M-Q9XA-D2PF-0000", ""):
        with pytest.raises(PairingCodeError):
            normalize_pairing_code(bad)


def test_issue_and_redeem(served: Relay) -> None:
    vault_id = new_vault_id("pair")
    issued = issue(served, vault_id, label="Alice's laptop")
    assert issued.status_code == 200, issued.text
    body = issued.json()
    assert CODE.fullmatch(body["code"]), body
    assert (body["vault_id"], body["label"], body["device_bound"]) == (
        vault_id,
        "Alice's laptop",
        True,
    )
    stored = served.sql("SELECT * FROM pairing_codes WHERE vault_id = $1", vault_id)
    assert bytes(stored[0]["code_hash"]) == hashlib.sha256(body["code"].encode()).digest()
    assert stored[0]["created_by"] == "key:static:0"
    ttl = stored[0]["expires_at"] - stored[0]["created_at"]
    assert 590 <= ttl.total_seconds() <= 610

    device = new_device_id()
    typed = body["code"].lower().replace("-", " ")
    redeemed = redeem(served, typed, device, label=None)
    assert redeemed.status_code == 200, redeemed.text
    got = redeemed.json()
    assert (got["vault_id"], got["device_id"], got["label"], got["device_bound"]) == (
        vault_id,
        device,
        "Alice's laptop",
        True,
    )
    key = got["api_key"]
    assert key.startswith("en_")
    assert_error(redeem(served, body["code"], new_device_id()), 410, "code_invalid")

    sealer = Sealer(vault_id)
    with client(served, key) as c:
        roster = c.get(f"/v1/vaults/{vault_id}/devices").json()["devices"]
        assert [(d["device_id"], d["label"]) for d in roster] == [(device, "Alice's laptop")]
        assert push_ok(c, vault_id, [sealer.blob("m1", 1, device_id=device)])["accepted"] == 1
        foreign = push_ok(c, vault_id, [sealer.blob("m2", 1, device_id=new_device_id())])
        assert foreign["rejected"] == ["m2"]  # device-bound (§10)
        assert_error(c.delete(f"/v1/vaults/{vault_id}/devices/{device}"), 403)  # not admin
        assert pull_ok(c, vault_id, cursor=0)["blobs"]
    row = served.sql("SELECT redeemed_at, redeemed_device_id FROM pairing_codes")
    assert [(r["redeemed_device_id"]) for r in row if r["redeemed_at"]].count(device) == 1
    keys = served.sql(
        "SELECT is_admin, device_id, vault_id FROM api_keys WHERE id = $1", got["key_id"]
    )
    assert [tuple(r) for r in keys] == [(False, device, vault_id)]


def test_unbound_code_and_a_label_from_the_device(served: Relay) -> None:
    vault_id = new_vault_id("pair")
    code = issue(served, vault_id, device_bound=False).json()["code"]
    got = redeem(served, code, new_device_id(), label="  desktop  ").json()
    assert (got["device_bound"], got["label"]) == (False, "desktop")
    with client(served, got["api_key"]) as c:
        other = new_device_id()
        assert push_ok(c, vault_id, [Sealer(vault_id).blob("m", 1, device_id=other)])["accepted"]


def test_twenty_concurrent_redemptions_one_winner(served: Relay) -> None:
    vault_id = new_vault_id("race")
    code = issue(served, vault_id).json()["code"]
    devices = [new_device_id() for _ in range(20)]
    ip = "127.3.3.3"  # one address, still within the per-IP burst

    def attempt(device: str) -> httpx.Response:
        with http(served, ip=ip) as c:
            return c.post("/pair/redeem", json={"code": code, "device_id": device, "label": "x"})

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(attempt, devices))
    winners = [r for r in answers if r.status_code == 200]
    assert len(winners) == 1, [r.status_code for r in answers]
    for loser in answers:
        if loser.status_code != 200:
            assert_error(loser, 410, "code_invalid")
    keys = served.sql("SELECT device_id FROM api_keys WHERE vault_id = $1", vault_id)
    assert [r["device_id"] for r in keys] == [winners[0].json()["device_id"]]
    roster = served.sql("SELECT device_id FROM devices WHERE vault_id = $1", vault_id)
    assert len(roster) == 1


def test_expired_unknown_and_used_codes_get_one_answer(served: Relay) -> None:
    vault_id = new_vault_id("exp")
    code = issue(served, vault_id).json()["code"]
    served.sql(
        "UPDATE pairing_codes SET expires_at = now() - interval '1 minute' WHERE vault_id = $1",
        vault_id,
    )
    expired = redeem(served, code, new_device_id())
    assert_error(expired, 410, "code_invalid")
    assert served.sql("SELECT * FROM pairing_codes WHERE vault_id = $1", vault_id) == []
    assert served.sql("SELECT * FROM api_keys WHERE vault_id = $1", vault_id) == []
    unknown = redeem(served, "ENG-0000-0000-0000", new_device_id())
    assert (unknown.status_code, unknown.json()) == (expired.status_code, expired.json())
    malformed = redeem(served, "ENG-1234", new_device_id())
    assert assert_error(malformed, 400, "invalid_request")["field"] == "code"
    assert assert_error(redeem(served, code, ""), 400, "invalid_request")["field"] == "device_id"


def test_revoked_device_cannot_redeem_and_the_code_survives(served: Relay) -> None:
    vault_id = new_vault_id("rev")
    code = issue(served, vault_id).json()["code"]
    revoked = new_device_id()
    with client(served) as c:
        c.delete(f"/v1/vaults/{vault_id}/devices/{revoked}")
    assert_error(redeem(served, code, revoked), 403, "device_revoked")
    assert redeem(served, code, new_device_id()).status_code == 200


def test_at_most_five_live_codes_per_vault(served: Relay) -> None:
    vault_id = new_vault_id("five")
    codes = [issue(served, vault_id).json()["code"] for _ in range(5)]
    assert_error(issue(served, vault_id), 409, "too_many_codes")
    assert redeem(served, codes[0], new_device_id()).status_code == 200  # one used: room again
    assert issue(served, vault_id).status_code == 200
    served.sql("UPDATE pairing_codes SET expires_at = now() WHERE vault_id = $1", vault_id)
    assert issue(served, vault_id).status_code == 200  # expired ones do not count


def test_who_may_issue_codes(served: Relay) -> None:
    vault_id = new_vault_id("who")
    member, admin = served.mint(vault_id), served.mint(vault_id, admin=True)
    other_admin = served.mint(new_vault_id(), admin=True)
    assert issue(served, vault_id, admin).status_code == 200
    assert_error(issue(served, vault_id, member), 403)
    assert_error(issue(served, vault_id, other_admin), 403)
    assert_error(issue(served, vault_id, ""), 401, "unauthorized")

    owner = signup(served)
    owned = new_vault_id("owned")
    with owner.client(served) as c:
        assert (
            c.put(
                f"/account/vaults/{owned}/wrap", json={"wrapped_k": "A" * 80, "password": PASSWORD}
            ).status_code
            == 200
        )
    by_session = issue(served, owned, owner.token)
    assert by_session.status_code == 200, by_session.text
    assert_error(issue(served, vault_id, owner.token), 403, "not_vault_owner")
    stranger: Account = signup(served)
    assert_error(issue(served, owned, stranger.token), 403, "not_vault_owner")
    # A key redeemed from an account's code belongs to that account (listed, revocable).
    got = redeem(served, by_session.json()["code"], new_device_id()).json()
    with owner.client(served) as c:
        assert got["key_id"] in {k["id"] for k in c.get("/account").json()["keys"]}


def test_bad_bodies(served: Relay) -> None:
    vault_id = new_vault_id("bad")
    assert assert_error(issue(served, vault_id, label="x" * 129), 400)["field"] == "label"
    assert assert_error(issue(served, vault_id, device_bound="yes"), 400)["field"] == "device_bound"
    with http(served) as c:
        assert_error(
            c.post("/pair/redeem", content=b"{", headers={"content-type": "application/json"}), 400
        )


def test_cli_pair_prints_a_code(served: Relay) -> None:
    vault_id = new_vault_id("cli")
    env = {**os.environ, "ENGRAM_RELAY_DATABASE_URL": served.database_url}
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "engram-relay"),
            "pair",
            "--vault",
            vault_id,
            "--label",
            "kitchen tablet",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    code = done.stdout.strip()
    assert CODE.fullmatch(code), done.stdout
    assert vault_id in done.stderr
    got = redeem(served, code, new_device_id(), label=None)
    assert got.status_code == 200, got.text
    assert (got.json()["vault_id"], got.json()["label"]) == (vault_id, "kitchen tablet")


def test_the_relay_never_takes_the_secret_part(served: Relay) -> None:
    """PROTOCOL §14 step 4: clients send the first part only; a whole code is refused
    (400, nothing redeemed), so a client that sent one by mistake learns it at once."""
    vault_id = new_vault_id("secret")
    code = issue(served, vault_id).json()["code"]
    whole = f"{code}-ABCD-EFGH"
    refused = redeem(served, whole, new_device_id())
    assert assert_error(refused, 400, "invalid_request")["field"] == "code"
    assert "ABCD" not in refused.text
    assert redeem(served, code, new_device_id()).status_code == 200  # still unused
