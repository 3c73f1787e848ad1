"""`engram-sync team grant|grants|ungrant` (PROTOCOL §13 "Vault ownership";
docs/vault-ownership.md), run as processes against a real relay and PostgreSQL.

An account owns a vault by minting its first key there; a second account gets 403
`vault_owned` on keys and wraps until the owner's admin device grants it, and again once
the grant is removed. Member keys are refused, an unknown email is one clear line, and a
relay whose grant answers name another vault or account is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engram_sync.client._session import VaultSession
from tests.e2e.hostile.proxy import Answer, Exchange, HostileProxy
from tests.relay.accounts.helpers import PASSWORD, Account, new_email, signup
from tests.relay.conftest import Relay
from tests.relay.support import assert_error, module_relay, new_vault_id

EXE = str(Path(sys.executable).parent / "engram-sync")
PASSPHRASE = "team grants test passphrase"
WRAP = "A" * 80


@pytest.fixture(scope="module")
def served(postgres_url: str) -> Iterator[Relay]:
    with module_relay(postgres_url) as relay:
        yield relay


def mint(
    relay: Relay, account: Account, vault_id: str, *, admin: bool | None = None
) -> httpx.Response:
    """`admin` None leaves the field out: the best key the account may have (PROTOCOL §13)."""
    fields: dict[str, Any] = {"vault_id": vault_id}
    if admin is not None:
        fields["admin"] = admin
    with account.client(relay) as c:
        return c.post("/account/keys", json=fields)


def put_wrap(relay: Relay, account: Account, vault_id: str) -> httpx.Response:
    with account.client(relay) as c:
        return c.put(
            f"/account/vaults/{vault_id}/wrap", json={"wrapped_k": WRAP, "password": PASSWORD}
        )


def refused(response: httpx.Response) -> None:
    assert_error(response, 403, "vault_owned")


class Device:
    """A vault directory linked to `url` with `api_key`, driven through `engram-sync`."""

    def __init__(self, path: Path, url: str, api_key: str, vault_id: str) -> None:
        self.path = path
        with VaultSession.open(path, PASSPHRASE, create=True) as session:
            session.link(url, api_key, vault_id, path.name)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE, HOME=str(self.path.parent))
        env.pop("ENGRAM_VAULT", None)
        return subprocess.run(
            [EXE, "--vault", str(self.path), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    def ok(self, *args: str) -> str:
        result = self.run(*args)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def fails(self, *args: str) -> str:
        """The command exits 1 with one `error: ...` line and no traceback; that line."""
        result = self.run(*args)
        assert result.returncode == 1, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: "), result.stderr
        assert "Traceback" not in result.stderr
        return lines[0]

    def grants(self) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = json.loads(self.ok("team", "grants", "--json"))
        return listed


def owned_vault(
    relay: Relay, tmp_path: Path, *, url: str | None = None
) -> tuple[Device, str, Account]:
    """A vault alice's account owns (its first key claims it), her admin device, alice."""
    alice = signup(relay)
    vault_id = new_vault_id("grants")
    minted = mint(relay, alice, vault_id)
    assert minted.status_code == 200, minted.text
    device = Device(tmp_path / "alice", url or relay.url, minted.json()["key"], vault_id)
    return device, vault_id, alice


def test_a_grant_lets_another_account_in_and_ungrant_shuts_it_out(
    served: Relay, tmp_path: Path
) -> None:
    admin, vault_id, _ = owned_vault(served, tmp_path)
    bob = signup(served)
    refused(mint(served, bob, vault_id))
    refused(put_wrap(served, bob, vault_id))
    assert admin.grants() == []
    assert f"no account is granted vault {vault_id}" in admin.ok("team", "grants")

    shown = admin.ok("team", "grant", bob.email)
    assert f"granted vault {vault_id} to {bob.email.lower()} ({bob.account_id})" in shown
    assert mint(served, bob, vault_id).status_code == 200
    assert put_wrap(served, bob, vault_id).status_code == 200
    [listed] = admin.grants()
    assert (listed["account_id"], listed["email"]) == (bob.account_id, bob.email.lower())
    table = admin.ok("team", "grants")
    assert bob.email.lower() in table
    assert bob.account_id in table
    assert admin.ok("team", "grant", bob.account_id)  # idempotent, and by account id too
    assert len(admin.grants()) == 1

    removed = admin.ok("team", "ungrant", bob.email.upper())
    assert f"removed the grant of vault {vault_id} for {bob.email.lower()}" in removed
    assert admin.grants() == []
    refused(mint(served, bob, vault_id))
    again = admin.fails("team", "ungrant", bob.account_id)
    assert again == (
        f"error: vault {vault_id} has no grant for {bob.account_id}: "
        "`engram-sync team grants` lists them"
    )


def test_a_member_key_cannot_grant(served: Relay, tmp_path: Path) -> None:
    admin, vault_id, alice = owned_vault(served, tmp_path)
    minted = mint(served, alice, vault_id, admin=False)
    assert minted.status_code == 200, minted.text
    member = Device(tmp_path / "member", served.url, minted.json()["key"], vault_id)
    carol = signup(served)

    line = member.fails("team", "grant", carol.email)
    assert line.startswith(f"error: grants of vault {vault_id} need an admin key for it")
    assert "run this on an admin's device" in line
    member.fails("team", "grants")
    refused(mint(served, carol, vault_id))  # nothing was granted

    admin.ok("team", "grant", carol.email)  # the admin's key, same vault: granted
    assert mint(served, carol, vault_id).status_code == 200
    assert member.fails("team", "ungrant", carol.email).startswith(
        f"error: grants of vault {vault_id} need an admin key"
    )
    assert [g["account_id"] for g in admin.grants()] == [carol.account_id]


def test_an_unknown_email_is_one_clear_line(served: Relay, tmp_path: Path) -> None:
    admin, _, _ = owned_vault(served, tmp_path)
    nobody = new_email()
    line = admin.fails("team", "grant", nobody)
    assert line == (
        f"error: the relay at {served.url} has no account {nobody}: its owner signs up first "
        f"(`engram-sync account signup --relay {served.url}`), then run this again"
    )
    assert admin.grants() == []
    dave = signup(served)  # the same command with an existing account works
    admin.ok("team", "grant", dave.email)
    assert [g["account_id"] for g in admin.grants()] == [dave.account_id]


@pytest.fixture
def proxy(served: Relay) -> Iterator[HostileProxy]:
    server = HostileProxy(served.url).start()
    try:
        yield server
    finally:
        server.stop()


def test_grant_answers_naming_another_vault_or_account_are_refused(
    served: Relay, proxy: HostileProxy, tmp_path: Path
) -> None:
    admin, _, _ = owned_vault(served, tmp_path, url=proxy.url)
    erin = signup(served)
    admin.ok("team", "grant", erin.email)  # honest proxy: works
    assert [g["account_id"] for g in admin.grants()] == [erin.account_id]

    def other_vault(exchange: Exchange) -> Answer:
        body = exchange.json()
        body["vault_id"] = "someone-elses-vault"
        return Answer(200, body)

    proxy.on("GET", r"/grants$", other_vault, times=1)
    line = admin.fails("team", "grants")
    assert "with the grants of vault 'someone-elses-vault': refused" in line

    def smuggled(exchange: Exchange) -> Answer:
        body = exchange.json()
        body["grants"][0]["vault_id"] = "someone-elses-vault"
        return Answer(200, body)

    proxy.on("GET", r"/grants$", smuggled, times=1)
    assert "with a grant of vault 'someone-elses-vault': refused" in admin.fails("team", "grants")

    def escapes(exchange: Exchange) -> Answer:
        body = exchange.json()
        body["grants"][0]["email"] = "\x1b]0;owned\x07mallory@example.org"
        return Answer(200, body)

    proxy.on("GET", r"/grants$", escapes, times=1)
    assert "with a grant with a malformed email: refused" in admin.fails("team", "grants")

    frank = signup(served)

    def someone_else(exchange: Exchange) -> Answer:
        body = exchange.json()
        body["email"] = "mallory@example.org"
        return Answer(200, body)

    proxy.on("POST", r"/grants$", someone_else, times=1)
    line = admin.fails("team", "grant", frank.email)
    assert f"a grant for 'mallory@example.org', not '{frank.email}': refused" in line
    assert len(admin.grants()) == 2  # the relay did grant frank: the lie is only refused

    def wrong_removal(exchange: Exchange) -> Answer:
        body = exchange.json()
        body["account_id"] = "acct_0000000000000000"
        return Answer(200, body)

    proxy.on("DELETE", r"/grants/", wrong_removal, times=1)
    line = admin.fails("team", "ungrant", frank.email)
    assert "with the removal of 'acct_0000000000000000' from vault" in line
    assert [g["account_id"] for g in admin.grants()] == [erin.account_id]


def test_a_relay_without_grants_says_so(served: Relay, proxy: HostileProxy, tmp_path: Path) -> None:
    admin, vault_id, _ = owned_vault(served, tmp_path, url=proxy.url)

    def old_info(exchange: Exchange) -> Answer:
        body = exchange.json()
        body["features"] = [f for f in body["features"] if f != "vault-grants"]
        return Answer(200, body)

    def no_route(exchange: Exchange) -> Answer:
        return Answer(404, {"error": "Not Found", "code": "not_found"})

    proxy.on("GET", r"^/v1/info$", old_info)
    proxy.on("GET", r"/grants$", no_route, forward=False)
    line = admin.fails("team", "grants")
    assert line == (
        f"error: the relay at {proxy.url} does not offer vault grants (no `vault-grants` in "
        f"its /v1/info features): ask its operator to upgrade it, or to run `engram-relay "
        f"vaults grant {vault_id} EMAIL`"
    )
    proxy.honest()
    assert admin.grants() == []


def test_team_grant_admin_and_what_each_role_may_do(served: Relay, tmp_path: Path) -> None:
    """Issue 31 finding 4 (PROTOCOL §13 "Grants carry a role"), through `engram-sync`: the
    owner's `team grant --admin` gives the admin role; an admin grant's device grants
    members but not admins; a member grant's device manages no grants; the listing shows
    each role; `team ungrant` revokes the account's keys at once."""
    owner, vault_id, _ = owned_vault(served, tmp_path)
    carol, dave, bob = signup(served), signup(served), signup(served)
    shown = owner.ok("team", "grant", "--admin", carol.email)
    assert f"to {carol.email.lower()} ({carol.account_id}) as admin" in shown
    owner.ok("team", "grant", bob.email)
    carol_key = mint(served, carol, vault_id).json()["key"]
    carol_device = Device(tmp_path / "carol", served.url, carol_key, vault_id)
    shown = carol_device.ok("team", "grant", dave.email)
    assert f"to {dave.email.lower()} ({dave.account_id}) as member" in shown
    line = carol_device.fails("team", "grant", "--admin", dave.email)
    assert line.startswith(f"error: only the owner of vault {vault_id} may give or take back")
    assert "run this on an owner's device" in line
    line = carol_device.fails("team", "ungrant", carol.email)  # an admin's grant: the owner's
    assert line.startswith(f"error: only the owner of vault {vault_id}")
    assert_error(mint(served, bob, vault_id, admin=True), 403, "admin_not_granted")
    bob_key = mint(served, bob, vault_id, admin=False).json()["key"]
    bob_device = Device(tmp_path / "bob", served.url, bob_key, vault_id)
    line = bob_device.fails("team", "grant", dave.email)
    assert line.startswith(f"error: grants of vault {vault_id} need an admin key for it")
    roles = {g["email"]: g["role"] for g in owner.grants()}
    assert roles == {
        carol.email.lower(): "admin",
        dave.email.lower(): "member",
        bob.email.lower(): "member",
    }
    table = owner.ok("team", "grants")
    assert "role" in table
    assert "admin" in table
    # Removing bob's grant revokes his key at once: his next pull is refused.
    removed = owner.ok("team", "ungrant", bob.email)
    assert "the keys it minted for the vault are revoked" in removed
    with httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {bob_key}"}) as c:
        assert c.get(f"/v1/vaults/{vault_id}/pull", params={"cursor": 0}).status_code == 401
    assert "error: " in bob_device.fails("sync")
