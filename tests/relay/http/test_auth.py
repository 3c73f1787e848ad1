"""The auth matrix of PROTOCOL §5 and §10 on every vault route, over real HTTP.

For each route: no key / unknown key / revoked key → 401, key for another vault → 403,
non-admin on the admin route → 403, device-bound key of a revoked device → 403
`device_revoked`; each exclusion is next to the positive case it excludes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engram_sync.relay.domain.api_keys import parse_static_keys
from engram_sync.relay.store.minted_keys import create_key, revoke_key
from tests.relay.conftest import ADMIN_KEY, Relay
from tests.relay.support import (
    SSL,
    Sealer,
    assert_error,
    client,
    module_relay,
    new_device_id,
    new_vault_id,
    push,
    push_ok,
    run_db,
)

SCOPED_KEY = "scoped-static-key-0123456789"  # member of team-a, admin of team-b
SHORT_KEY = "short-key-15chr"  # 15 characters: ignored by the relay
assert len(SHORT_KEY) == 15
TEAM_A = "team-a-auth"
TEAM_B = "team-b-auth"

ROUTES = ["push", "pull", "stats", "stats_alias", "devices", "register", "revoke"]
_clock = itertools.count(1)


@pytest.fixture(scope="module")
def relay(postgres_url: str) -> Iterator[Relay]:
    spec = f"{ADMIN_KEY}:100000,{SCOPED_KEY}:1000:{TEAM_A};{TEAM_B}+admin,{SHORT_KEY}:10"
    with module_relay(postgres_url, static_keys=tuple(parse_static_keys(spec))) as served:
        yield served


def call(
    relay: Relay, route: str, vault_id: str, key: str | None, device_id: str | None = None
) -> httpx.Response:
    """One valid request to `route` of `vault_id` with `key` (None = no Authorization)."""
    device = device_id or new_device_id()
    with client(relay, key) as http:
        if route == "push":
            blob = Sealer(vault_id).blob(f"m-{next(_clock)}", next(_clock), device_id=device)
            return push(http, vault_id, [blob])
        if route == "pull":
            return http.get(f"/v1/vaults/{vault_id}/pull", params={"cursor": 0})
        if route == "stats":
            return http.get(f"/v1/vaults/{vault_id}/stats")
        if route == "stats_alias":
            return http.get(f"/sync/{vault_id}/stats")
        if route == "devices":
            return http.get(f"/v1/vaults/{vault_id}/devices")
        if route == "register":
            return http.post(
                f"/v1/vaults/{vault_id}/devices/register",
                json={"device_id": device, "label": "laptop"},
            )
        if route == "revoke":
            return http.delete(f"/v1/vaults/{vault_id}/devices/{device}")
    raise AssertionError(route)


def assert_ok(response: httpx.Response, route: str) -> None:
    assert response.status_code == 200, (route, response.status_code, response.text)
    if route == "push":
        assert response.json()["accepted"] == 1, response.text


def revoke_key_in_sql(relay: Relay, key_prefix: str) -> None:
    relay.sql("UPDATE api_keys SET revoked_at = now() WHERE prefix = $1", key_prefix)


@pytest.mark.parametrize("route", ROUTES)
def test_no_key_is_401(relay: Relay, route: str) -> None:
    vault = new_vault_id()
    body = assert_error(call(relay, route, vault, None), 401, "unauthorized")
    assert "Authorization" in body["error"]
    assert_ok(call(relay, route, vault, ADMIN_KEY), route)


@pytest.mark.parametrize(
    "header",
    ["Basic dXNlcjpwYXNz", "Bearer", ADMIN_KEY, f"Token {ADMIN_KEY}", f"{ADMIN_KEY} Bearer"],
)
def test_malformed_authorization_is_401(relay: Relay, header: str) -> None:
    with httpx.Client(base_url=relay.url, headers={"Authorization": header}, verify=SSL) as http:
        response = http.get(f"/v1/vaults/{new_vault_id()}/stats")
    assert_error(response, 401, "unauthorized")
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("route", ROUTES)
def test_unknown_key_is_401(relay: Relay, route: str) -> None:
    vault = new_vault_id()
    assert_error(call(relay, route, vault, "en_" + "A" * 43), 401, "unauthorized")
    assert_error(call(relay, route, vault, ADMIN_KEY + "x"), 401, "unauthorized")
    assert_error(call(relay, route, vault, SHORT_KEY), 401, "unauthorized")
    assert_ok(call(relay, route, vault, ADMIN_KEY), route)


@pytest.mark.parametrize("route", ROUTES)
def test_revoked_key_is_401(relay: Relay, route: str) -> None:
    vault = new_vault_id()
    key = relay.mint(vault, admin=True)
    assert_ok(call(relay, route, vault, key), route)
    revoke_key_in_sql(relay, key[:8])
    assert_error(call(relay, route, vault, key), 401, "unauthorized")


def test_revoked_key_via_the_key_store_is_401(relay: Relay) -> None:
    vault = new_vault_id()

    async def mint_and_revoke(conn: Any) -> str:
        key_id, key = await create_key(conn, vault_id=vault, is_admin=False)
        with client(relay, key) as http:
            assert http.get(f"/v1/vaults/{vault}/stats").status_code == 200
        assert await revoke_key(conn, key_id)
        assert await revoke_key(conn, key_id)  # idempotent
        assert not await revoke_key(conn, "k_nosuchkey")
        return key

    key = run_db(relay.database_url, mint_and_revoke)
    with client(relay, key) as http:
        assert_error(http.get(f"/v1/vaults/{vault}/stats"), 401, "unauthorized")


@pytest.mark.parametrize("route", ROUTES)
def test_key_for_another_vault_is_403(relay: Relay, route: str) -> None:
    mine, theirs = new_vault_id(), new_vault_id()
    key = relay.mint(mine, admin=True)
    body = assert_error(call(relay, route, theirs, key), 403, "forbidden")
    assert "vault" in body["error"]
    assert_ok(call(relay, route, mine, key), route)


@pytest.mark.parametrize("route", ROUTES)
def test_scoped_static_key(relay: Relay, route: str) -> None:
    assert_error(call(relay, route, new_vault_id(), SCOPED_KEY), 403, "forbidden")
    assert_ok(call(relay, route, TEAM_B, SCOPED_KEY), route)
    if route == "revoke":
        assert_error(call(relay, route, TEAM_A, SCOPED_KEY), 403, "forbidden")
    else:
        assert_ok(call(relay, route, TEAM_A, SCOPED_KEY), route)


def test_non_admin_key_cannot_revoke(relay: Relay) -> None:
    vault = new_vault_id()
    member, admin = relay.mint(vault), relay.mint(vault, admin=True)
    for route in ROUTES[:-1]:
        assert_ok(call(relay, route, vault, member), route)
    device = new_device_id()
    body = assert_error(call(relay, "revoke", vault, member, device), 403, "forbidden")
    assert "admin" in body["error"]
    assert relay.sql("SELECT 1 FROM devices WHERE device_id = $1", device) == []
    assert_ok(call(relay, "revoke", vault, admin, device), "revoke")
    assert_ok(call(relay, "revoke", vault, ADMIN_KEY, device), "revoke")


@pytest.mark.parametrize("how", ["route", "sql"])
@pytest.mark.parametrize("route", ROUTES)
def test_device_bound_key_of_a_revoked_device_is_403_device_revoked(
    relay: Relay, route: str, how: str
) -> None:
    vault = new_vault_id()
    device = new_device_id()
    key = relay.mint(vault, admin=True, device_id=device)
    other_device = new_device_id()
    other = relay.mint(vault, device_id=other_device)  # another device's key stays valid
    # Positive case first (on the admin route: revoking some other device).
    assert_ok(call(relay, route, vault, key, None if route == "revoke" else device), route)
    if how == "route":
        with client(relay, ADMIN_KEY) as http:
            assert http.delete(f"/v1/vaults/{vault}/devices/{device}").status_code == 200
    else:  # the device row alone, without touching the key
        relay.sql(
            "INSERT INTO devices (vault_id, device_id, revoked_at) VALUES ($1, $2, now())"
            " ON CONFLICT (vault_id, device_id) DO UPDATE SET revoked_at = now()",
            vault,
            device,
        )
    body = assert_error(call(relay, route, vault, key, device), 403, "device_revoked")
    assert device in body["error"]
    if route != "revoke":
        assert_ok(call(relay, route, vault, other, other_device), route)


def test_device_bound_key_pushes_only_its_own_device(relay: Relay) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    key = relay.mint(vault, device_id=sealer.device_id)
    with client(relay, key) as http:
        answer = push_ok(
            http,
            vault,
            [sealer.blob("mine", 1), sealer.blob("theirs", 1, device_id=new_device_id())],
        )
        assert answer["accepted"] == 1
        assert answer["rejected"] == ["theirs"]
        assert answer["revoked_devices"] == []
        # Registering another device's label is refused too.
        response = http.post(
            f"/v1/vaults/{vault}/devices/register",
            json={"device_id": new_device_id(), "label": "not me"},
        )
        assert_error(response, 403, "forbidden")


def test_rate_limit_is_429_with_retry_after(relay: Relay) -> None:
    vault = new_vault_id()
    key = relay.mint(vault, rate=1)  # burst 1
    with client(relay, key) as http:
        statuses = []
        for _ in range(20):
            response = http.get(f"/v1/vaults/{vault}/stats")
            statuses.append(response.status_code)
            if response.status_code == 429:
                break
    assert statuses[0] == 200
    assert statuses[-1] == 429, statuses
    assert_error(response, 429, "rate_limited")
    assert int(response.headers["retry-after"]) >= 1
    # The bucket is per key: another key is unaffected.
    with client(relay, relay.mint(vault, rate=1)) as http:
        assert http.get(f"/v1/vaults/{vault}/stats").status_code == 200
