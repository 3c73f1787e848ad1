"""The client address the per-address limits count (relay.domain.client_address)."""

from __future__ import annotations

from typing import Any

from litestar import Request

from engram_sync.relay.domain.client_address import client_address, forwarded_for, limit_key
from engram_sync.relay.http.app_state import relay_state


def client_ip(request: Request[Any, Any, Any]) -> str:
    """What the per-IP limits count: the client address (X-Forwarded-For believed only from
    ENGRAM_RELAY_TRUSTED_PROXIES), an IPv6 one as its /64 (relay/domain/client_address.py)."""
    address = client_address(
        request.client.host if request.client else None,
        forwarded_for(request.scope["headers"]),
        relay_state(request).config.trusted_proxies,
    )
    return limit_key(address)
