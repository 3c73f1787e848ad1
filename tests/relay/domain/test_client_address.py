"""The client address the per-address limits count (relay/domain/client_address.py, issue 14
item 7)."""

from __future__ import annotations

import pytest

from engram_sync.relay.domain.client_address import client_address, limit_key, parse_trusted_proxies
from engram_sync.relay.services.config import config_from_env

CADDY = parse_trusted_proxies("172.30.87.254")


def test_an_untrusted_peer_is_the_client_whatever_it_forwards() -> None:
    assert client_address("198.51.100.7", ["203.0.113.1"], ()) == "198.51.100.7"
    assert client_address("198.51.100.7", ["203.0.113.1"], CADDY) == "198.51.100.7"
    assert client_address("198.51.100.7", [], CADDY) == "198.51.100.7"


def test_a_trusted_hop_names_the_client_right_most_first() -> None:
    # Caddy appended 203.0.113.9; the left part is whatever the client sent.
    assert client_address("172.30.87.254", ["203.0.113.9"], CADDY) == "203.0.113.9"
    spoofed = ["10.9.9.9, 1.2.3.4", "203.0.113.9"]
    assert client_address("172.30.87.254", spoofed, CADDY) == "203.0.113.9"
    assert client_address("172.30.87.254", ["1.2.3.4, 203.0.113.9"], CADDY) == "203.0.113.9"


def test_one_hop_per_trusted_proxy() -> None:
    two = parse_trusted_proxies("172.30.87.254, 10.0.0.0/8")
    chain = ["6.6.6.6, 203.0.113.9, 10.1.2.3"]  # client -> 10.1.2.3 -> Caddy -> relay
    assert client_address("172.30.87.254", chain, two) == "203.0.113.9"
    assert client_address("172.30.87.254", chain, CADDY) == "10.1.2.3"  # 10/8 not trusted


def test_a_trusted_peer_without_a_usable_header_is_itself() -> None:
    assert client_address("172.30.87.254", [], CADDY) == "172.30.87.254"
    assert client_address("172.30.87.254", ["not-an-ip"], CADDY) == "172.30.87.254"
    assert client_address("172.30.87.254", ["172.30.87.254"], CADDY) == "172.30.87.254"
    # Ports and brackets, as some proxies write them.
    assert client_address("172.30.87.254", ["203.0.113.9:4711"], CADDY) == "203.0.113.9"
    assert client_address("172.30.87.254", ["[2001:db8::5]:4711"], CADDY) == "2001:db8::5"


def test_ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() -> None:
    assert limit_key("2001:db8:1:2:aaaa::1") == limit_key("2001:db8:1:2:ffff::9")
    assert limit_key("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert limit_key("2001:db8:1:3::1") != limit_key("2001:db8:1:2::1")
    assert limit_key("203.0.113.9") == "203.0.113.9"
    assert limit_key("203.0.113.8") != limit_key("203.0.113.9")
    assert client_address("::ffff:198.51.100.7", [], ()) == "198.51.100.7"
    assert limit_key("unknown") == "unknown"


def test_the_setting_is_parsed_from_the_environment() -> None:
    config = config_from_env(
        "postgresql://x/y", {"ENGRAM_RELAY_TRUSTED_PROXIES": " ::1, 10.0.0.0/8 "}
    )
    assert [str(n) for n in config.trusted_proxies] == ["::1/128", "10.0.0.0/8"]
    assert config_from_env("postgresql://x/y", {}).trusted_proxies == ()
    with pytest.raises(ValueError, match="ENGRAM_RELAY_TRUSTED_PROXIES: 'caddy' is not an IP"):
        config_from_env("postgresql://x/y", {"ENGRAM_RELAY_TRUSTED_PROXIES": "caddy"})
