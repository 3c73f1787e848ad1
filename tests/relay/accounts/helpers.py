"""Helpers for the account, pairing and handoff tests: real HTTP from distinct loopback IPs.

Every client gets its own source address in 127.0.0.0/8 (Linux routes the whole
block to loopback), so the relay's per-IP limits see distinct people unless a
test deliberately reuses one address.
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass
from typing import Any

import httpx

from tests.relay.conftest import Relay
from tests.relay.support import SSL

PASSWORD = "correct horse battery staple"
_addresses = itertools.count(1)


def fresh_ip() -> str:
    """A loopback source address no other client of this process used."""
    n = next(_addresses)
    return f"127.{100 + n // 62500 % 100}.{n // 250 % 250 + 1}.{n % 250 + 2}"


def http(relay: Relay, token: str | None = None, *, ip: str | None = None) -> httpx.Client:
    """A client of `relay` from `ip` (default: a fresh address), bearer `token` if given."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.HTTPTransport(local_address=ip or fresh_ip(), verify=SSL)
    return httpx.Client(base_url=relay.url, headers=headers, timeout=30, transport=transport)


def new_email() -> str:
    """An email nobody signed up with, in mixed case (the relay lowercases it)."""
    return f"Person.{secrets.token_hex(5)}@Example.ORG"


@dataclass
class Account:
    """A signed-up account and its current session."""

    email: str
    password: str
    account_id: str
    token: str

    def client(self, relay: Relay) -> httpx.Client:
        """A client authenticated by this account's session."""
        return http(relay, self.token)


def signup(relay: Relay, password: str = PASSWORD, email: str | None = None) -> Account:
    """Sign up (which also signs in); requires a 200."""
    email = email or new_email()
    with http(relay) as client:
        response = client.post("/auth/signup", json={"email": email, "password": password})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return Account(email, password, body["account_id"], body["session_token"])


def signin(relay: Relay, email: str, password: str) -> httpx.Response:
    """POST /auth/signin from a fresh address."""
    with http(relay) as client:
        return client.post("/auth/signin", json={"email": email, "password": password})
