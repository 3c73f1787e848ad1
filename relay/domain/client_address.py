"""Who is asking: the client address the per-address limits count (issue 14 item 7).

The peer address of the TCP connection is the client, unless the peer is one of the
configured proxy hops (`ENGRAM_RELAY_TRUSTED_PROXIES`, IPs and CIDR networks; default
none). Then `X-Forwarded-For` is read from the right: each trusted hop appended the
address it saw, so the right-most address that is not a trusted hop is the client. The
left of the header is whatever the client sent and is never believed, so rotating it
changes nothing. uvicorn's own proxy header handling is off (relay.serving.server), so the
peer address reaching the app is the real one.

For limiting, IPv6 clients are grouped by their /64 (one host commonly holds a whole
/64, and addresses in it cost nothing); IPv4-mapped IPv6 peers count as IPv4.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Final

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

ENV_TRUSTED_PROXIES: Final = "ENGRAM_RELAY_TRUSTED_PROXIES"
IPV6_LIMIT_PREFIX: Final = 64
FORWARDED_FOR: Final = b"x-forwarded-for"


def parse_trusted_proxies(text: str) -> tuple[Network, ...]:
    """`10.0.0.2, 172.30.87.0/24, ::1` as networks; ValueError naming a bad entry."""
    networks: list[Network] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(
                f"{ENV_TRUSTED_PROXIES}: {entry!r} is not an IP address or CIDR network "
                "(e.g. 172.30.87.200 or 10.0.0.0/8)"
            ) from None
    return tuple(networks)


def _ip(text: str | None) -> IPAddress | None:
    """An address from a peer host or a forwarded hop (`1.2.3.4:5`, `[::1]:5` allowed)."""
    if not text:
        return None
    text = text.strip()
    if text.startswith("["):
        text = text[1 : text.find("]")] if "]" in text else text
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _trusted(ip: IPAddress, trusted: Iterable[Network]) -> bool:
    return any(ip.version == net.version and ip in net for net in trusted)


def client_address(
    peer: str | None, forwarded_for: Iterable[str], trusted: tuple[Network, ...]
) -> str:
    """The client's address: the peer, or (peer a trusted hop) the right-most address of
    `X-Forwarded-For` (all its header lines, in order) that is not a trusted hop."""
    current = _ip(peer)
    if current is None:
        return peer or "unknown"
    if not trusted or not _trusted(current, trusted):
        return str(current)
    hops = [hop for value in forwarded_for for hop in value.split(",")]
    for hop in reversed(hops):
        ip = _ip(hop)
        if ip is None:
            break  # not an address: stop at the last hop a trusted proxy vouched for
        current = ip
        if not _trusted(ip, trusted):
            break
    return str(current)


def limit_key(address: str) -> str:
    """What a per-address limit counts: the address, or its /64 for IPv6."""
    ip = _ip(address)
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, IPV6_LIMIT_PREFIX), strict=False))
    return str(ip) if ip is not None else address


def forwarded_for(headers: Iterable[tuple[bytes, bytes]]) -> list[str]:
    """The `X-Forwarded-For` header lines of raw ASGI headers, in order."""
    return [value.decode("latin-1") for name, value in headers if name == FORWARDED_FOR]
