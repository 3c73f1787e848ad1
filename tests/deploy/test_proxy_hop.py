"""The compose TLS profile's proxy hop (issue 14 item 7): the relay believes the
X-Forwarded-For of Caddy, and only of Caddy.

Before, the relay trusted nothing it was told to (uvicorn's FORWARDED_ALLOW_IPS was never
set), so behind Caddy every client had Caddy's address and 30 wrong sign-ins a minute,
from anyone, locked everyone out.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

import pytest

from engram_sync.relay.domain.client_address import client_address
from engram_sync.relay.services.config import config_from_env
from tests.deploy.support import DEPLOY, ROOT

COMPOSE = ROOT / "docker-compose.yml"
_DEFAULT = re.compile(r"\$\{(?P<name>[A-Z_]+):-(?P<default>[^}]*)\}")


def compose() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    spec: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return spec


def env_default(value: str) -> str:
    """The default of a `${NAME:-default}` compose value."""
    match = _DEFAULT.fullmatch(value)
    assert match, value
    return match["default"]


def test_the_relay_trusts_exactly_caddys_fixed_address() -> None:
    spec = compose()
    relay, caddy = spec["services"]["relay"], spec["services"]["caddy"]
    caddy_ip = ipaddress.IPv4Address(caddy["networks"]["default"]["ipv4_address"])
    (pool,) = spec["networks"]["default"]["ipam"]["config"]
    subnet = ipaddress.IPv4Network(pool["subnet"])
    dynamic = ipaddress.IPv4Network(pool["ip_range"])
    gateway = ipaddress.IPv4Address(pool["gateway"])
    # Caddy's address is on the network but outside the range the other containers get
    # theirs from, so no other container can ever hold it.
    assert caddy_ip in subnet
    assert caddy_ip not in dynamic
    assert dynamic.subnet_of(subnet)
    # Every service is on that one network (compose's default), none elsewhere.
    assert all(
        set(s.get("networks", {"default": None})) == {"default"} for s in spec["services"].values()
    )

    setting = env_default(relay["environment"]["ENGRAM_RELAY_TRUSTED_PROXIES"])
    config = config_from_env("postgresql://x/y", {"ENGRAM_RELAY_TRUSTED_PROXIES": setting})
    assert config.trusted_proxies == (ipaddress.ip_network(f"{caddy_ip}/32"),)

    visitor = "203.0.113.9"
    # What Caddy forwards names the client ...
    assert (
        client_address(str(caddy_ip), [f"10.6.6.6, {visitor}"], config.trusted_proxies) == visitor
    )
    # ... what anything else on the network (the gateway, where connections to the
    # published port come from; another container) forwards does not.
    for other in (gateway, next(dynamic.hosts()), caddy_ip - 1):
        assert client_address(str(other), [visitor], config.trusted_proxies) == str(other)


def test_caddy_overwrites_what_the_client_sent() -> None:
    """Caddy sets X-Forwarded-For to the address that connected, dropping the client's
    own, as long as no `trusted_proxies` is configured; nor may the header be passed on."""
    text = (DEPLOY / "Caddyfile").read_text()
    directives = [line.split("#", 1)[0] for line in text.splitlines()]
    assert not any("trusted_proxies" in line for line in directives)
    assert not any("X-Forwarded-For" in line for line in directives)
    assert "reverse_proxy relay:8788" in text
