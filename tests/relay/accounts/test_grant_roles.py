"""Grants carry a role (PROTOCOL §13; issue 31 finding 4), over real HTTP.

Before, a grant was full admin: a granted account minted admin keys, revoked the owner's
devices, granted others and retired the vault to its own successor, and removing the
grant left its keys valid. Now a `member` grant mints member keys only; an `admin` grant
may also mint admin keys, grant `member` and revoke devices; retiring (and undoing it),
granting `admin` and taking it back are the owner's; removing a grant revokes its keys at
once. Each refusal sits next to the honest path it must not break.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from tests.relay.accounts.helpers import PASSWORD, Account, http, signup
from tests.relay.conftest import Relay
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    new_device_id,
    new_vault_id,
    pull,
    push,
    push_ok,
)

WRAP = "A" * 80


def mint(relay: Relay, account: Account, vault_id: str, **fields: Any) -> httpx.Response:
    with account.client(relay) as c:
        return c.post("/account/keys", json={"vault_id": vault_id, **fields})


def key_of(relay: Relay, account: Account, vault_id: str, **fields: Any) -> str:
    answer = mint(relay, account, vault_id, **fields)
    assert answer.status_code == 200, answer.text
    key: str = answer.json()["key"]
    return key


def grant(key: str, relay: Relay, vault_id: str, who: Account, **fields: Any) -> httpx.Response:
    with http(relay, key) as c:
        return c.post(f"/v1/vaults/{vault_id}/grants", json={"email": who.email, **fields})


def ungrant(key: str, relay: Relay, vault_id: str, who: Account) -> httpx.Response:
    with http(relay, key) as c:
        return c.delete(f"/v1/vaults/{vault_id}/grants/{who.account_id}")


def revoke_device(key: str, relay: Relay, vault_id: str, device_id: str) -> httpx.Response:
    with http(relay, key) as c:
        return c.delete(f"/v1/vaults/{vault_id}/devices/{device_id}")


def retire(key: str, relay: Relay, vault_id: str, successor: str | None = None) -> httpx.Response:
    with http(relay, key) as c:
        return c.post(f"/v1/vaults/{vault_id}/retire", json={"successor": successor})


def undo_retire(key: str, relay: Relay, vault_id: str) -> httpx.Response:
    with http(relay, key) as c:
        return c.delete(f"/v1/vaults/{vault_id}/retire")


def owner_of(relay: Relay, vault_id: str) -> tuple[str, str | None]:
    (row,) = relay.sql("SELECT owner, account_id FROM vault_owners WHERE vault_id = $1", vault_id)
    return row["owner"], row["account_id"]


@dataclass
class Team:
    vault: str
    owner: Account
    owner_key: str  # the owning account's admin key
    owner_device: str  # a device of the owner, bound to its own key, holding a blob


def team(relay: Relay) -> Team:
    """A vault the account `owner` owns, with one device that pushed."""
    owner = signup(relay)
    vault = new_vault_id("roles")
    owner_key = key_of(relay, owner, vault)
    sealer = Sealer(vault)
    device_key = key_of(relay, owner, vault, device_id=sealer.device_id, admin=False)
    with http(relay, device_key) as c:
        push_ok(c, vault, [sealer.blob("m1", 1)])
    return Team(vault, owner, owner_key, sealer.device_id)


def test_a_member_grant_mints_member_keys_and_administers_nothing(served: Relay) -> None:
    t, bob, carol = team(served), signup(served), signup(served)
    given = grant(t.owner_key, served, t.vault, bob)
    assert given.status_code == 200, given.text
    assert given.json()["role"] == "member"  # the default
    # The honest path: a member key (asked for, or by leaving `admin` out), which syncs.
    left_out = mint(served, bob, t.vault)
    assert left_out.status_code == 200, left_out.text
    assert left_out.json()["is_admin"] is False
    assert mint(served, bob, t.vault, admin=False).json()["is_admin"] is False
    member_key = left_out.json()["key"]
    sealer = Sealer(t.vault)
    with http(served, member_key) as c:
        push_ok(c, t.vault, [sealer.blob("bob", 1)])
        assert pull(c, t.vault, cursor=0).status_code == 200
    # An admin key: refused with a code that says why, and nothing minted.
    body = assert_error(mint(served, bob, t.vault, admin=True), 403, "admin_not_granted")
    assert "member grant" in body["error"]
    keys = served.sql(
        "SELECT is_admin FROM api_keys WHERE account_id = $1 AND vault_id = $2",
        bob.account_id,
        t.vault,
    )
    assert [r["is_admin"] for r in keys] == [False, False]
    # No device revocation, no grant, no retire with a member key.
    assert_error(revoke_device(member_key, served, t.vault, t.owner_device), 403)
    assert_error(grant(member_key, served, t.vault, carol), 403)
    assert_error(retire(member_key, served, t.vault), 403)
    # An admin key minted under a grant before revision 0016 made it `member` (every grant
    # was admin then) is admin no more: its account's grant is read on each admin request.
    old_admin = key_of(served, bob, t.vault, admin=False)
    served.sql("UPDATE api_keys SET is_admin = true WHERE account_id = $1", bob.account_id)
    for refused in (
        revoke_device(old_admin, served, t.vault, t.owner_device),
        grant(old_admin, served, t.vault, carol),
        retire(old_admin, served, t.vault),
        ungrant(old_admin, served, t.vault, bob),
    ):
        assert_error(refused, 403, "admin_not_granted")
    with http(served, t.owner_key) as c:  # the owner's device was not revoked
        devices = c.get(f"/v1/vaults/{t.vault}/devices").json()["devices"]
    assert not any(d["revoked"] for d in devices)
    assert served.sql("SELECT retired_at FROM vaults WHERE vault_id = $1", t.vault)[0][0] is None
    assert owner_of(served, t.vault) == ("account", t.owner.account_id)


def test_an_admin_grant_administers_but_cannot_take_the_vault(served: Relay) -> None:
    t, carol, dave, eve = team(served), signup(served), signup(served), signup(served)
    # Only the owner gives `admin`.
    given = grant(t.owner_key, served, t.vault, carol, role="admin")
    assert given.status_code == 200, given.text
    assert given.json()["role"] == "admin"
    assert mint(served, carol, t.vault).json()["is_admin"] is True  # left out: admin
    carol_key = key_of(served, carol, t.vault, admin=True)
    # What an admin grant may do: grant member, revoke devices, remove member grants.
    assert grant(carol_key, served, t.vault, dave).json()["role"] == "member"
    victim = new_device_id()
    assert revoke_device(carol_key, served, t.vault, victim).status_code == 200
    with http(served, carol_key) as c:
        listed = c.get(f"/v1/vaults/{t.vault}/grants").json()["grants"]
    assert {(g["email"], g["role"]) for g in listed} == {
        (carol.email.lower(), "admin"),
        (dave.email.lower(), "member"),
    }
    # What it may not: grant admin (also not by adopting), take admin back, remove an admin
    # grant, retire or undo a retire.
    assert_error(grant(carol_key, served, t.vault, dave, role="admin"), 403, "owner_only")
    assert_error(grant(carol_key, served, t.vault, eve, role="admin"), 403, "owner_only")
    assert_error(grant(carol_key, served, t.vault, carol), 403, "owner_only")  # a demotion
    assert_error(ungrant(carol_key, served, t.vault, carol), 403, "owner_only")
    body = assert_error(retire(carol_key, served, t.vault), 403, "owner_only")
    assert "only the owner" in body["error"]
    retired_into_own = new_vault_id("carols")
    assert key_of(served, carol, retired_into_own)  # carol owns this one
    assert_error(retire(carol_key, served, t.vault, retired_into_own), 403, "owner_only")
    assert_error(undo_retire(carol_key, served, t.vault), 403, "owner_only")
    with eve.client(served) as c:  # adopting with an admin grant's key grants `member`
        adopted = c.put(
            f"/account/vaults/{t.vault}/wrap",
            json={"wrapped_k": WRAP, "password": PASSWORD},
            headers={"X-Engram-Vault-Key": carol_key},
        )
    assert adopted.status_code == 200, adopted.text
    assert_error(mint(served, eve, t.vault, admin=True), 403, "admin_not_granted")
    assert ungrant(carol_key, served, t.vault, dave).json()["revoked"] is True
    assert owner_of(served, t.vault) == ("account", t.owner.account_id)
    assert served.sql("SELECT retired_at FROM vaults WHERE vault_id = $1", t.vault)[0][0] is None
    # The owner takes admin back: carol's admin keys become member keys at once.
    assert grant(t.owner_key, served, t.vault, carol).json()["role"] == "member"
    with carol.client(served) as c:  # and say so where the account lists its keys
        keys = c.get("/account").json()["keys"]
        assert not any(k["is_admin"] for k in keys if k["vault_id"] == t.vault)
    assert_error(revoke_device(carol_key, served, t.vault, new_device_id()), 403)
    with http(served, carol_key) as c:
        assert pull(c, t.vault, cursor=0).status_code == 200  # still a member
    # The owner's own admin key does all of it.
    assert grant(t.owner_key, served, t.vault, eve, role="admin").json()["role"] == "admin"
    assert ungrant(t.owner_key, served, t.vault, eve).json()["revoked"] is True
    assert revoke_device(t.owner_key, served, t.vault, new_device_id()).status_code == 200


def test_a_bad_role_is_a_400_naming_it(served: Relay) -> None:
    t, bob = team(served), signup(served)
    body = assert_error(grant(t.owner_key, served, t.vault, bob, role="root"), 400)
    assert "role" in body["error"]
    assert not served.sql("SELECT 1 FROM vault_grants WHERE account_id = $1", bob.account_id)


def test_removing_a_grant_revokes_its_keys_at_once(served: Relay) -> None:
    t, bob, carol = team(served), signup(served), signup(served)
    assert grant(t.owner_key, served, t.vault, bob).status_code == 200
    assert grant(t.owner_key, served, t.vault, carol, role="admin").status_code == 200
    sealer = Sealer(t.vault)
    bob_key = key_of(served, bob, t.vault, device_id=sealer.device_id)
    carol_key = key_of(served, carol, t.vault)
    with http(served, bob.token) as c:  # a pairing code of bob's session, redeemed
        code = c.post(f"/v1/vaults/{t.vault}/pairing-codes", json={}).json()["code"]
    with http(served) as c:
        paired = c.post("/pair/redeem", json={"code": code, "device_id": new_device_id()})
    assert paired.status_code == 200, paired.text
    with http(served, carol_key) as c:  # and one of carol's admin key
        code = c.post(f"/v1/vaults/{t.vault}/pairing-codes", json={}).json()["code"]
    with http(served) as c:
        carol_paired = c.post("/pair/redeem", json={"code": code, "device_id": new_device_id()})
    assert carol_paired.status_code == 200, carol_paired.text
    keys = [bob_key, paired.json()["api_key"], carol_key, carol_paired.json()["api_key"]]
    for key in keys:  # the honest path: every key syncs while the grants stand
        with http(served, key) as c:
            assert pull(c, t.vault, cursor=0).status_code == 200
    with http(served, bob_key) as c:
        push_ok(c, t.vault, [sealer.blob("bob", 1)])
    assert ungrant(t.owner_key, served, t.vault, bob).json()["revoked"] is True
    assert ungrant(t.owner_key, served, t.vault, carol).json()["revoked"] is True
    for key in keys:  # the very next request of each is refused, pull and push
        with http(served, key) as c:
            assert pull(c, t.vault, cursor=0).status_code in (401, 403)
            assert push(c, t.vault, [sealer.blob("bob", 2)]).status_code in (401, 403)
    # The owner's keys and devices are untouched.
    with http(served, t.owner_key) as c:
        assert pull(c, t.vault, cursor=0).status_code == 200
    assert (
        served.sql(
            "SELECT count(*) FROM api_keys WHERE vault_id = $1 AND account_id = $2"
            " AND revoked_at IS NULL",
            t.vault,
            t.owner.account_id,
        )[0][0]
        == 2
    )


def test_the_owner_retires_and_undoes_it_within_the_grace_period(served: Relay) -> None:
    t = team(served)
    sealer = Sealer(t.vault)
    assert retire(t.owner_key, served, t.vault).status_code == 200
    with http(served, t.owner_key) as c:
        assert_error(push(c, t.vault, [sealer.blob("x", 1)]), 410, "vault_retired")
    undone = undo_retire(t.owner_key, served, t.vault)
    assert undone.status_code == 200, undone.text
    assert undone.json() == {"vault_id": t.vault, "undone": True}
    with http(served, t.owner_key) as c:
        push_ok(c, t.vault, [sealer.blob("x", 1)])  # live again
        page = pull(c, t.vault, cursor=0).json()
    assert "retired" not in page
    # Idempotent: a vault that is not retired answers `undone: false`.
    assert undo_retire(t.owner_key, served, t.vault).json()["undone"] is False
    # The operator may too, on an operator vault.
    ops = new_vault_id("ops-retire")
    with client(served) as operator:
        push_ok(operator, ops, [Sealer(ops).blob("m", 1)])
        assert operator.post(f"/v1/vaults/{ops}/retire", json={"successor": None}).is_success
        assert operator.delete(f"/v1/vaults/{ops}/retire").json()["undone"] is True
        # Past erase_after the undo is refused, as every route of an erased vault is.
        assert operator.post(f"/v1/vaults/{ops}/retire", json={"successor": None}).is_success
        served.sql("UPDATE vaults SET erase_after = retired_at WHERE vault_id = $1", ops)
        assert_error(operator.delete(f"/v1/vaults/{ops}/retire"), 410, "vault_retired")
    assert served.sql("SELECT retired_at FROM vaults WHERE vault_id = $1", ops)[0][0] is not None
