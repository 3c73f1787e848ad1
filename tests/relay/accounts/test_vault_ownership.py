"""Vault ownership (PROTOCOL §13, issue 14 item 1): the first user of a vault id owns it.

The squatting scenario of the issue, over real HTTP and the real `engram-relay` CLI:
an account that claims an id first keeps it, and the operator is stopped before
minting into it; a vault the operator (or another account) uses first gets one
answer, 403 `vault_owned`, on keys and on wraps; an admin's grant lets an account in.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx

from engram_sync.relay.cli.vaults import claim_static_vaults
from engram_sync.relay.domain.api_keys import parse_static_keys
from tests.relay.accounts.helpers import PASSWORD, Account, http, signup
from tests.relay.conftest import ADMIN_KEY, Relay
from tests.relay.support import Sealer, assert_error, client, new_vault_id, push, push_ok

WRAP = "A" * 80
BIN = Path(sys.executable).parent


def mint(relay: Relay, account: Account, vault_id: str) -> httpx.Response:
    with account.client(relay) as c:
        return c.post("/account/keys", json={"vault_id": vault_id})


def put_wrap(relay: Relay, account: Account, vault_id: str, **headers: str) -> httpx.Response:
    with account.client(relay) as c:
        return c.put(
            f"/account/vaults/{vault_id}/wrap",
            json={"wrapped_k": WRAP, "password": PASSWORD},
            headers=headers,
        )


def owner_of(relay: Relay, vault_id: str) -> tuple[str, str | None] | None:
    rows = relay.sql("SELECT owner, account_id FROM vault_owners WHERE vault_id = $1", vault_id)
    return None if not rows else (rows[0]["owner"], rows[0]["account_id"])


def refused(response: httpx.Response, vault_id: str) -> dict[str, Any]:
    """403 `vault_owned`; the body with the vault id taken out, to compare answers."""
    body = assert_error(response, 403, "vault_owned")
    return {k: str(v).replace(vault_id, "<v>") for k, v in body.items()}


def relay_cli(relay: Relay, *args: str, env: dict[str, str] | None = None) -> Any:
    full = {k: v for k, v in os.environ.items() if "DATABASE_URL" not in k}
    full.pop("SYNC_API_KEYS", None)
    full.update(env or {})
    return subprocess.run(
        [str(BIN / "engram-relay"), *args, "--database-url", relay.database_url],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_first_account_owns_a_fresh_vault_and_keeps_using_it(served: Relay) -> None:
    alice = signup(served)
    vault_id = new_vault_id("first")
    first = mint(served, alice, vault_id)  # the first key claims the id (no wrap needed)
    assert first.status_code == 200, first.text
    assert owner_of(served, vault_id) == ("account", alice.account_id)
    assert put_wrap(served, alice, vault_id).status_code == 200
    assert mint(served, alice, vault_id).status_code == 200
    with http(served, first.json()["key"]) as c:
        push_ok(c, vault_id, [Sealer(vault_id).blob("m", 1)])  # its first push changes nothing
    assert owner_of(served, vault_id) == ("account", alice.account_id)
    # Deleting the wrap does not set the id free.
    with alice.client(served) as c:
        gone = c.request("DELETE", f"/account/vaults/{vault_id}/wrap", json={"password": PASSWORD})
        assert gone.json()["deleted"] is True
    bob = signup(served)
    refused(put_wrap(served, bob, vault_id), vault_id)
    assert put_wrap(served, alice, vault_id).status_code == 200


def test_an_operator_vault_is_refused_to_accounts_on_keys_and_wraps(served: Relay) -> None:
    pushed, minted = new_vault_id("pushed"), new_vault_id("minted")
    with client(served) as operator:  # a first push with an operator key
        push_ok(operator, pushed, [Sealer(pushed).blob("m", 1)])
    served.mint(minted)  # `engram-relay keys create`, as the store does it
    bob = signup(served)
    for vault_id in (pushed, minted):
        assert owner_of(served, vault_id) == ("operator", None)
        refused(mint(served, bob, vault_id), vault_id)
        refused(put_wrap(served, bob, vault_id), vault_id)
    assert not served.sql("SELECT 1 FROM api_keys WHERE account_id = $1", bob.account_id)
    assert not served.sql("SELECT 1 FROM vault_wraps WHERE account_id = $1", bob.account_id)
    # Next to it, the same account on a fresh id is fine.
    assert mint(served, bob, new_vault_id("mine")).status_code == 200


def test_another_accounts_vault_gets_the_same_answer(served: Relay) -> None:
    alice, bob = signup(served), signup(served)
    theirs, operators = new_vault_id("theirs"), new_vault_id("ops")
    assert put_wrap(served, alice, theirs).status_code == 200
    served.mint(operators)
    for call in (mint, put_wrap):
        assert refused(call(served, bob, theirs), theirs) == refused(
            call(served, bob, operators), operators
        )
    # Nor can bob pair devices into alice's vault with his session.
    with http(served, bob.token) as c:
        answer = c.post(f"/v1/vaults/{theirs}/pairing-codes", json={})
    assert_error(answer, 403, "not_vault_owner")


def test_a_granted_account_may_mint_and_wrap_until_the_grant_goes(served: Relay) -> None:
    vault_id = new_vault_id("granted")
    with client(served) as operator:
        push_ok(operator, vault_id, [Sealer(vault_id).blob("m", 1)])
    bob = signup(served)
    refused(mint(served, bob, vault_id), vault_id)
    grants = f"/v1/vaults/{vault_id}/grants"
    with client(served) as admin:
        given = admin.post(grants, json={"email": bob.email.upper()})
        assert given.status_code == 200, given.text
        assert given.json()["account_id"] == bob.account_id
        assert admin.post(grants, json={"email": bob.email}).status_code == 200  # idempotent
        listed = admin.get(grants).json()["grants"]
        expected = [(bob.account_id, bob.email.lower())]
        assert [(g["account_id"], g["email"]) for g in listed] == expected
    assert mint(served, bob, vault_id).status_code == 200
    assert put_wrap(served, bob, vault_id).status_code == 200
    with http(served, bob.token) as c:
        assert c.post(f"/v1/vaults/{vault_id}/pairing-codes", json={}).status_code == 200
    assert owner_of(served, vault_id) == ("operator", None)  # a grant is not ownership
    with client(served) as admin:
        removed = admin.delete(f"{grants}/{bob.account_id}")
        assert removed.json() == {"vault_id": vault_id, "account_id": bob.account_id,
                                  "revoked": True}  # fmt: skip
        assert admin.delete(f"{grants}/{bob.account_id}").json()["revoked"] is False
    refused(mint(served, bob, vault_id), vault_id)
    refused(put_wrap(served, bob, vault_id), vault_id)


def test_grants_need_an_admin_of_the_vault(served: Relay) -> None:
    alice, carol = signup(served), signup(served)
    vault_id = new_vault_id("team")
    owner_key = mint(served, alice, vault_id).json()["key"]  # admin by default
    member = served.mint(vault_id)
    grants = f"/v1/vaults/{vault_id}/grants"
    with http(served, member) as c:
        assert_error(c.post(grants, json={"email": carol.email}), 403)
    with http(served, alice.token) as c:  # sessions are not keys here
        assert_error(c.post(grants, json={"email": carol.email}), 401, "unauthorized")
    with http(served, served.mint(new_vault_id(), admin=True)) as c:  # another vault's admin
        assert_error(c.post(grants, json={"email": carol.email}), 403)
    refused(mint(served, carol, vault_id), vault_id)
    with http(served, owner_key) as c:  # the owning account's admin key may grant
        assert_error(c.post(grants, json={"email": "nobody@example.org"}), 404, "no_account")
        assert_error(c.post(grants, json={}), 400, "invalid_request")
        both = {"email": carol.email, "account_id": carol.account_id}
        assert_error(c.post(grants, json=both), 400, "invalid_request")
        assert c.post(grants, json={"account_id": carol.account_id}).status_code == 200
    assert mint(served, carol, vault_id).status_code == 200
    assert owner_of(served, vault_id) == ("account", alice.account_id)


def test_adopting_with_an_admin_key_is_a_grant(served: Relay) -> None:
    vault_id = new_vault_id("adopt")
    admin_key = served.mint(vault_id, admin=True)
    bob = signup(served)
    refused(put_wrap(served, bob, vault_id), vault_id)
    member = served.mint(vault_id)
    assert_error(put_wrap(served, bob, vault_id, **{"X-Engram-Vault-Key": member}), 403)
    adopted = put_wrap(served, bob, vault_id, **{"X-Engram-Vault-Key": admin_key})
    assert adopted.status_code == 200, adopted.text
    rows = served.sql(
        "SELECT granted_by FROM vault_grants WHERE vault_id = $1 AND account_id = $2",
        vault_id,
        bob.account_id,
    )
    assert [r["granted_by"] for r in rows] == [f"key:{served_key_id(served, admin_key)}"]
    assert mint(served, bob, vault_id).status_code == 200


def served_key_id(relay: Relay, key: str) -> str:
    from engram_sync.relay.domain.api_keys import hash_key

    rows = relay.sql("SELECT id FROM api_keys WHERE key_hash = $1", hash_key(key))
    return str(rows[0]["id"])


def test_racing_accounts_have_exactly_one_winner(served: Relay) -> None:
    vault_id = new_vault_id("race")
    accounts = [signup(served) for _ in range(6)]
    barrier = threading.Barrier(len(accounts) * 2)
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def go(account: Account, call: Any) -> None:
        barrier.wait()
        answer = call(served, account, vault_id)
        with lock:
            answers.append(answer)

    threads = [
        threading.Thread(target=go, args=(a, call)) for a in accounts for call in (mint, put_wrap)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (row,) = served.sql("SELECT account_id FROM vault_owners WHERE vault_id = $1", vault_id)
    winners = {row["account_id"]}
    assert winners <= {a.account_id for a in accounts}
    codes = sorted(r.status_code for r in answers)
    # The winner's key and wrap succeed; each loser's two calls get 403 (nothing written).
    assert codes.count(403) == 10, codes
    assert codes.count(200) == 2, codes
    for r in answers:
        if r.status_code == 403:
            refused(r, vault_id)
    writers = served.sql(
        "SELECT account_id FROM api_keys WHERE vault_id = $1 UNION"
        " SELECT account_id FROM vault_wraps WHERE vault_id = $1",
        vault_id,
    )
    assert {r["account_id"] for r in writers} == winners


def test_the_squatting_scenario_stops_the_operator(served: Relay) -> None:
    """Issue 14 item 1: an account claims the id first; the operator is told before minting."""
    squatter = signup(served)
    vault_id = new_vault_id("squat")
    assert put_wrap(served, squatter, vault_id).status_code == 200
    stopped = relay_cli(served, "keys", "create", "--vault", vault_id)
    assert stopped.returncode == 2, stopped
    assert stopped.stdout == ""
    line = stopped.stderr.strip()
    assert "\n" not in line, line
    assert "Traceback" not in line
    assert f"vault {vault_id} is owned by an account (id prefix {squatter.account_id[:13]}" in line
    assert "pass --force to mint a key anyway" in line
    assert not served.sql("SELECT 1 FROM api_keys WHERE vault_id = $1", vault_id)
    paired = relay_cli(served, "pair", "--vault", vault_id)
    assert paired.returncode == 2, paired
    assert "pass --force to mint a pairing code anyway" in paired.stderr
    assert not served.sql("SELECT 1 FROM pairing_codes WHERE vault_id = $1", vault_id)
    forced = relay_cli(served, "keys", "create", "--vault", vault_id, "--force")
    assert forced.returncode == 0, forced
    assert forced.stdout.strip().startswith("en_")
    assert owner_of(served, vault_id) == ("account", squatter.account_id)

    # The other order: the operator first, then the would-be squatter gets 403.
    taken = new_vault_id("ops-first")
    made = relay_cli(served, "keys", "create", "--vault", taken, "--admin")
    assert made.returncode == 0, made
    assert owner_of(served, taken) == ("operator", None)
    refused(mint(served, squatter, taken), taken)
    refused(put_wrap(served, squatter, taken), taken)
    with http(served, made.stdout.strip()) as team:  # the team's key works as before
        push_ok(team, taken, [Sealer(taken).blob("m", 1)])


def test_static_keys_claim_their_vaults_and_refuse_account_vaults(served: Relay) -> None:
    alice = signup(served)
    owned, fresh = new_vault_id("static-owned"), new_vault_id("static-fresh")
    assert put_wrap(served, alice, owned).status_code == 200
    keys = parse_static_keys(f"{'s' * 20}:10:{fresh}+admin,{'t' * 20}:10")
    assert asyncio.run(claim_static_vaults(served.database_url, keys)) == []
    assert owner_of(served, fresh) == ("operator", None)
    keys = parse_static_keys(f"{'s' * 20}:10:{fresh};{owned}")
    (problem,) = asyncio.run(claim_static_vaults(served.database_url, keys))
    assert f"names vault {owned}, which is owned by an account" in problem
    assert owner_of(served, owned) == ("account", alice.account_id)
    # `serve` stops on it before it listens, with that one line.
    started = relay_cli(
        served, "serve", "--port", "0", env={"SYNC_API_KEYS": f"{'s' * 20}:10:{owned}"}
    )
    assert started.returncode == 2, started
    assert f"SYNC_API_KEYS names vault {owned}" in started.stderr
    assert "listening" not in started.stdout


def test_a_push_with_an_account_key_does_not_claim(served: Relay) -> None:
    """Only a vault nobody owns is claimed by a first push; with the id already owned by
    the account, its first push leaves it so (and a global key's push elsewhere claims)."""
    alice = signup(served)
    vault_id = new_vault_id("acct-push")
    key = mint(served, alice, vault_id).json()["key"]
    with http(served, key) as c:
        push_ok(c, vault_id, [Sealer(vault_id).blob("m", 1)])
    assert owner_of(served, vault_id) == ("account", alice.account_id)
    other = new_vault_id("global-push")
    with client(served, ADMIN_KEY) as c:
        assert push(c, other, [Sealer(other).blob("m", 1)]).status_code == 200
    assert owner_of(served, other) == ("operator", None)
