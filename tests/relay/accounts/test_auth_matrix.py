"""The auth matrix of the new routes: no auth, wrong vault, non-admin, wrong token kind.

Session tokens work only on /account (and /auth/logout) — plus pairing-code
issuing for an owning account; API keys never work on /account; session tokens
are unknown keys on every other vault route.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from engram_sync.shared_format.handoff import new_handoff_keypair
from tests.relay.accounts.helpers import PASSWORD, Account, http, signin, signup
from tests.relay.conftest import ADMIN_KEY, Relay
from tests.relay.support import assert_error, module_relay, new_vault_id

WRAP = "A" * 80


@dataclass(frozen=True)
class World:
    """A vault with an owning account, a member key, an admin key and a pending request."""

    relay: Relay
    vault_id: str
    owner: Account
    member: str
    admin: str
    foreign_admin: str
    request_id: str


@pytest.fixture(scope="module")
def world(postgres_url: str) -> Iterator[World]:
    with module_relay(postgres_url) as relay:
        owner = signup(relay)
        vault_id = new_vault_id("matrix")
        with owner.client(relay) as c:
            r = c.put(
                f"/account/vaults/{vault_id}/wrap", json={"wrapped_k": WRAP, "password": PASSWORD}
            )
            assert r.status_code == 200, r.text
            admin = c.post("/account/keys", json={"vault_id": vault_id}).json()["key"]
        member = relay.mint(vault_id)
        with http(relay, member) as c:
            r = c.post(
                f"/v1/vaults/{vault_id}/handoff",
                json={"public_key": new_handoff_keypair().public_key_b64url},
            )
            request_id = r.json()["request_id"]
        foreign_admin = relay.mint(new_vault_id(), admin=True)
        yield World(relay, vault_id, owner, member, admin, foreign_admin, request_id)


ACCOUNT_ROUTES = [
    ("GET", "/account"),
    ("POST", "/account/keys"),
    ("DELETE", "/account/keys/k_000000000000"),
    ("GET", "/account/wraps"),
    ("GET", "/account/wraps/password"),
    ("PUT", "/account/wraps/password"),
    ("GET", "/account/wraps/recovery"),
    ("PUT", "/account/wraps/recovery"),
    ("GET", "/account/vaults/{v}/wrap"),
    ("PUT", "/account/vaults/{v}/wrap"),
    ("DELETE", "/account/vaults/{v}/wrap"),
    ("POST", "/auth/logout"),
]

# (method, path, needs admin)
VAULT_ROUTES = [
    ("POST", "/v1/vaults/{v}/handoff", False),
    ("GET", "/v1/vaults/{v}/handoff", True),
    ("GET", "/v1/vaults/{v}/handoff/{r}", False),
    ("POST", "/v1/vaults/{v}/handoff/{r}/seal", True),
    ("POST", "/v1/vaults/{v}/handoff/{r}/claim", False),
    ("DELETE", "/v1/vaults/{v}/handoff/{r}", False),
    ("POST", "/v1/vaults/{v}/pairing-codes", True),
    ("POST", "/v1/vaults/{v}/grants", True),  # PROTOCOL §13 vault ownership
    ("GET", "/v1/vaults/{v}/grants", True),
    ("DELETE", "/v1/vaults/{v}/grants/acct_0000000000000000", True),
]


def call(world: World, method: str, path: str, token: str | None) -> httpx.Response:
    url = path.replace("{v}", world.vault_id).replace("{r}", world.request_id)
    with http(world.relay, token) as c:
        return c.request(method, url, json={})


@pytest.mark.parametrize(("method", "path"), ACCOUNT_ROUTES)
def test_account_routes_need_a_session(world: World, method: str, path: str) -> None:
    for token in (None, "ses_" + "x" * 43, world.admin, world.member, ADMIN_KEY):
        response = call(world, method, path, token)
        assert_error(response, 401, "unauthorized")
    # With a session the request gets past auth (then 200, 400, 404 ... never 401/403);
    # logout gets a session of its own so the shared one lives on.
    token = world.owner.token
    if path == "/auth/logout":
        token = signin(world.relay, world.owner.email, PASSWORD).json()["session_token"]
    assert call(world, method, path, token).status_code not in (401, 403)


@pytest.mark.parametrize(("method", "path", "admin"), VAULT_ROUTES)
def test_vault_routes_need_a_key_for_the_vault(
    world: World, method: str, path: str, admin: bool
) -> None:
    assert_error(call(world, method, path, None), 401, "unauthorized")
    assert_error(call(world, method, path, "en_unknown-key-0000000000000000"), 401, "unauthorized")
    assert_error(call(world, method, path, world.foreign_admin), 403)  # wrong vault
    if admin:
        assert_error(call(world, method, path, world.member), 403)
    if "pairing-codes" in path:  # the one vault route that takes an owner's session
        assert call(world, method, path, world.owner.token).status_code == 200
        stranger = signup(world.relay)
        assert_error(call(world, method, path, stranger.token), 403, "not_vault_owner")
    else:
        assert_error(call(world, method, path, world.owner.token), 401, "unauthorized")


def test_core_routes_refuse_session_tokens(world: World) -> None:
    for path in ("/pull?cursor=0", "/stats", "/devices"):
        response = call(world, "GET", f"/v1/vaults/{world.vault_id}{path}", world.owner.token)
        assert_error(response, 401, "unauthorized")


def test_public_auth_routes_need_no_auth(world: World) -> None:
    # Without credentials they answer on the merits (400 for an empty body), never 401.
    for path in (
        "/auth/signup",
        "/auth/signin",
        "/auth/recover/start",
        "/auth/recover",
        "/pair/redeem",
    ):
        assert call(world, "POST", path, None).status_code == 400
