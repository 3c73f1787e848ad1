"""ENGRAM_RELAY_LISTEN_DATABASE_URL (PROTOCOL §15, deploy/SCALING.md §2): the process's one
LISTEN connection goes to its own URL (straight to PostgreSQL when DATABASE_URL is a
transaction pooler), over a real relay and PostgreSQL.

The listener's URL here names another database role, so pg_stat_activity tells which URL
the LISTEN connection took; a long-poll woken by a push shows that it hears through it.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.services.config import RelayConfig, config_from_env
from tests.relay.conftest import Relay
from tests.relay.support import Sealer, new_vault_id, push_ok

LISTENER = "engram-relay-listen%"


def _sql(url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    async def go() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(to_libpq_url(url))
        try:
            rows: list[asyncpg.Record] = await conn.fetch(query, *args)
            return rows
        finally:
            await conn.close()

    return asyncio.run(go())


@pytest.fixture
def listen_role(fresh_database_url: str) -> Iterator[tuple[str, str]]:
    """A login role that may read `vaults` (the heads the listener reads after a reconnect),
    and the database URL as that role."""
    role, password = f"engram_listen_{secrets.token_hex(4)}", secrets.token_hex(12)
    _sql(fresh_database_url, f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    _sql(fresh_database_url, f"GRANT SELECT ON vaults TO {role}")
    parts = urlsplit(fresh_database_url)
    url = urlunsplit(parts._replace(netloc=f"{role}:{password}@{parts.netloc.rpartition('@')[2]}"))
    try:
        yield role, url
    finally:
        _sql(fresh_database_url, f"REVOKE ALL ON vaults FROM {role}")
        _sql(fresh_database_url, f"DROP ROLE {role}")


@pytest.fixture
def relay_config(
    relay_config: RelayConfig, request: pytest.FixtureRequest, listen_role: tuple[str, str]
) -> RelayConfig:
    own_url = request.param == "own-url"
    return replace(relay_config, listen_database_url=listen_role[1] if own_url else None)


def _listener_roles(relay: Relay) -> list[str]:
    """The roles of the relay's LISTEN connections, once it has one (it connects in the
    background)."""
    for _ in range(600):
        rows = _sql(relay.database_url, "SELECT usename FROM pg_stat_activity"
                    " WHERE application_name LIKE $1", LISTENER)  # fmt: skip
        if rows:
            return [r["usename"] for r in rows]
        threading.Event().wait(0.05)
    raise AssertionError("the relay opened no LISTEN connection")


def _long_poll_woken_by_a_push(http: httpx.Client, vault: str) -> int:
    """Blobs a `pull?wait=30` waiting before a push receives (0 if no notification came)."""
    push_ok(http, vault, Sealer(vault).blobs(1))  # the vault exists, cursor 1
    got: list[int] = []

    def wait() -> None:
        answer = http.get(f"/v1/vaults/{vault}/pull", params={"cursor": 1, "wait": 30})
        assert answer.status_code == 200, answer.text
        got.append(len(answer.json()["blobs"]))

    waiter = threading.Thread(target=wait)
    waiter.start()
    threading.Event().wait(0.5)  # let the long-poll start waiting (if not, it answers at once)
    push_ok(http, vault, Sealer(vault).blobs(1, prefix="second"))
    waiter.join(timeout=60)
    assert got, "the long-poll never answered"
    return got[0]


@pytest.mark.parametrize("relay_config", ["own-url"], indirect=True)
def test_the_listen_connection_takes_its_own_url(
    relay: Relay, http: httpx.Client, listen_role: tuple[str, str]
) -> None:
    assert _listener_roles(relay) == [listen_role[0]]
    assert _long_poll_woken_by_a_push(http, new_vault_id()) == 1


@pytest.mark.parametrize("relay_config", ["database-url"], indirect=True)
def test_without_it_the_listen_connection_takes_the_database_url(
    relay: Relay, http: httpx.Client, listen_role: tuple[str, str]
) -> None:
    roles = _listener_roles(relay)
    assert roles == [urlsplit(relay.database_url).username]
    assert listen_role[0] not in roles
    assert _long_poll_woken_by_a_push(http, new_vault_id()) == 1


def test_a_listen_url_that_is_not_postgresql_is_refused_by_name() -> None:
    env = {"ENGRAM_RELAY_LISTEN_DATABASE_URL": "mysql://u:secret@db/x"}
    with pytest.raises(ValueError, match="ENGRAM_RELAY_LISTEN_DATABASE_URL") as caught:
        config_from_env("postgresql://u@localhost/engram", env)
    assert "secret" not in str(caught.value)
    own = {"ENGRAM_RELAY_LISTEN_DATABASE_URL": "postgresql://l@db:5432/engram"}
    ok = config_from_env("postgresql://u@localhost/engram", own)
    assert ok.listen_url == "postgresql://l@db:5432/engram"
    assert config_from_env("postgresql://u@localhost/engram", {}).listen_url == (
        "postgresql://u@localhost/engram"
    )
