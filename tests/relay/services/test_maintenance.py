"""Background maintenance (relay.services.maintenance, issue 14 item 17): a serving relay compacts
tombstones and erases expired rows without `engram-relay gc`, one process at a time.

Real relays over HTTP on a real database. Nothing is timed: a test waits, up to a
generous bound, for a state (a row gone, a round counted), and the exclusion is shown
by holding the advisory lock from the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import replace

import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.services.config import RelayConfig, config_from_env
from engram_sync.relay.services.maintenance import MAINTENANCE_LOCK_KEY
from engram_sync.relay.store.accounts import create_account, create_session
from tests.relay.conftest import Relay, RelayThread
from tests.relay.support import (
    Sealer,
    client,
    new_vault_id,
    pull_ok,
    push_ok,
    run_db,
    serve,
    wait_for,
)

FAST = 0.05  # seconds between two rounds in these tests


@pytest.fixture
def relay_config(relay_config: RelayConfig) -> RelayConfig:
    return replace(relay_config, maintenance_interval_secs=FAST)


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a scrape; 0 when it is absent."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def rounds(relay: Relay, outcome: str) -> float:
    return sample(relay.scrape(), "engram_relay_maintenance_rounds_total", outcome=outcome)


def expired_tombstone(relay: Relay) -> str:
    """A vault with one tombstone past retention that its only device pulled past."""
    vault = tombstoned_vault(relay)
    age_tombstones(relay, vault)
    return vault


def tombstoned_vault(relay: Relay) -> str:
    """A vault with one young tombstone (seq 3) that its only device pulled past."""
    vault = new_vault_id()
    sealer = Sealer(vault)
    with client(relay, relay.mint(vault, device_id=sealer.device_id)) as http:
        push_ok(http, vault, [sealer.blob("m1", 1), sealer.blob("m2", 1)])
        push_ok(http, vault, [sealer.blob("m1", 2, deleted=True)])
        assert pull_ok(http, vault, cursor=0)["cursor"] == 3
    return vault


def age_tombstones(relay: Relay, vault: str) -> None:
    relay.sql(
        "UPDATE blobs SET received_at = now() - interval '40 days' WHERE vault_id = $1 AND deleted",
        vault,
    )


def tombstones(relay: Relay, vault: str) -> int:
    rows = relay.sql("SELECT count(*) AS n FROM blobs WHERE vault_id = $1 AND deleted", vault)
    return int(rows[0]["n"])


def expired_session(relay: Relay, email: str) -> bytes:
    async def go() -> bytes:
        conn = await asyncpg.connect(to_libpq_url(relay.database_url))
        try:
            account = await create_account(conn, email, "$argon2id$not-a-real-hash")
            assert account is not None
            await create_session(conn, account.account_id)
            token_hash: bytes = await conn.fetchval(
                "UPDATE sessions SET expires_at = now() - interval '1 hour'"
                " WHERE account_id = $1 RETURNING token_hash",
                account.account_id,
            )
            return token_hash
        finally:
            await conn.close()

    return asyncio.run(go())


def sessions_of(relay: Relay, token_hash: bytes) -> int:
    rows = relay.sql("SELECT count(*) AS n FROM sessions WHERE token_hash = $1", token_hash)
    return int(rows[0]["n"])


def seal_expired_handoff(relay: Relay) -> None:
    relay.sql(
        "INSERT INTO handoff_requests (vault_id, request_id, public_key, label,"
        " requester_key_id, created_at, expires_at, admin_public_key, sealed, sealed_at)"
        " VALUES ('v', 'r1', 'pk', 'l', 'k', now() - interval '2 hours',"
        " now() - interval '1 hour', 'apk', 'sealed-bytes', now() - interval '90 minutes')"
    )


def handoff_seal(relay: Relay) -> object:
    return relay.sql("SELECT sealed FROM handoff_requests WHERE request_id = 'r1'")[0]["sealed"]


@pytest.fixture
def held_lock(relay: Relay) -> Iterator[Callable[[], None]]:
    """The maintenance lock, held by the test's own session until `release()`."""
    loop = asyncio.new_event_loop()
    conn: asyncpg.Connection = loop.run_until_complete(
        asyncpg.connect(to_libpq_url(relay.database_url))
    )
    assert loop.run_until_complete(
        conn.fetchval("SELECT pg_try_advisory_lock($1)", MAINTENANCE_LOCK_KEY)
    )

    def release() -> None:
        assert loop.run_until_complete(
            conn.fetchval("SELECT pg_advisory_unlock($1)", MAINTENANCE_LOCK_KEY)
        )

    try:
        yield release
    finally:
        loop.run_until_complete(conn.close())
        loop.close()


def test_a_serving_relay_compacts_and_erases_without_gc(relay: Relay) -> None:
    vault = expired_tombstone(relay)
    token_hash = expired_session(relay, "old-session@example.com")
    seal_expired_handoff(relay)
    wait_for(lambda: tombstones(relay, vault) == 0, "the expired tombstone to be compacted")
    wait_for(lambda: sessions_of(relay, token_hash) == 0, "the expired session to be erased")
    wait_for(lambda: handoff_seal(relay) is None, "the expired seal to be erased")
    live = relay.sql("SELECT count(*) AS n FROM blobs WHERE vault_id = $1", vault)
    assert live[0]["n"] == 1  # m2 stays: compaction removes tombstones only
    horizon = relay.sql("SELECT compacted_through FROM vaults WHERE vault_id = $1", vault)
    assert horizon[0]["compacted_through"] == 3
    text = relay.scrape()
    assert sample(text, "engram_relay_tombstones_compacted_total") == 1
    assert sample(text, "engram_relay_expired_erased_total", kind="sessions") == 1
    assert sample(text, "engram_relay_expired_erased_total", kind="handoff_requests") == 1
    assert sample(text, "engram_relay_maintenance_rounds_total", outcome="ran") >= 1
    assert sample(text, "engram_relay_maintenance_rounds_total", outcome="failed") == 0


def test_keys_revoked_long_ago_are_purged_and_recent_ones_kept(relay: Relay) -> None:
    """A mint/revoke loop does not grow `api_keys` for ever: a round deletes keys revoked
    more than REVOKED_KEY_KEPT ago and keeps one revoked lately (listed to its owner); both
    are refused as before (401) and a live key keeps working. Operator keys stay (the
    first admin key is minted only while the table is empty)."""
    vault = new_vault_id()
    old, recent, live = (relay.mint(vault, device_id=f"dev-{n}") for n in range(3))
    relay.mint(vault, device_id="dev-operator")
    account = account_of(relay, "key-looper@example.com")
    relay.sql(
        "UPDATE api_keys SET account_id = $2 WHERE vault_id = $1 AND device_id <> 'dev-operator'",
        vault,
        account,
    )
    with client(relay, old) as http:
        pull_ok(http, vault)  # all three work before they are revoked
    relay.sql(
        "UPDATE api_keys SET revoked_at = now() - interval '31 days' WHERE device_id = 'dev-0'"
        " AND vault_id = $1",
        vault,
    )
    relay.sql(
        "UPDATE api_keys SET revoked_at = now() - interval '29 days' WHERE device_id = 'dev-1'"
        " AND vault_id = $1",
        vault,
    )
    relay.sql(
        "UPDATE api_keys SET revoked_at = now() - interval '400 days'"
        " WHERE device_id = 'dev-operator' AND vault_id = $1",
        vault,
    )
    wait_for(
        lambda: keys_of(relay, vault) == ["dev-1", "dev-2", "dev-operator"],
        "the account's old revoked key purged",
    )
    wait_for(
        lambda: (
            sample(relay.scrape(), "engram_relay_expired_erased_total", kind="revoked_keys") >= 1
        ),
        "the purge counted",
    )
    for refused in (recent, old):
        with client(relay, refused) as http:
            assert http.get(f"/v1/vaults/{vault}/pull", params={"cursor": 0}).status_code == 401
    with client(relay, live) as http:
        pull_ok(http, vault)


def account_of(relay: Relay, email: str) -> str:
    async def work(conn: asyncpg.Connection) -> str:
        account = await create_account(conn, email, "$argon2id$not-a-real-hash")
        assert account is not None
        return account.account_id

    return run_db(relay.database_url, work)


def keys_of(relay: Relay, vault: str) -> list[str]:
    rows = relay.sql("SELECT device_id FROM api_keys WHERE vault_id = $1 ORDER BY 1", vault)
    return [r["device_id"] for r in rows]


def test_a_round_is_skipped_while_another_session_holds_the_lock(
    relay: Relay, held_lock: Callable[[], None]
) -> None:
    """What a second replica (or worker) sees while one runs a round: it skips, and runs
    again once the lock is free."""
    vault = expired_tombstone(relay)
    wait_for(lambda: rounds(relay, "skipped") >= 3, "three skipped rounds")
    assert rounds(relay, "ran") == 0
    assert tombstones(relay, vault) == 1  # nobody compacted while the lock was held
    held_lock()
    wait_for(lambda: tombstones(relay, vault) == 0, "a round once the lock is free")
    assert rounds(relay, "ran") >= 1


def test_interval_zero_turns_maintenance_off(relay: Relay) -> None:
    """A relay with interval 0 next to one at FAST on the same database: while the other
    counts rounds, it counts none and compacts nothing itself."""
    off = replace(relay.config, maintenance_interval_secs=0)
    with serve(off) as quiet:
        wait_for(lambda: rounds(relay, "ran") + rounds(relay, "skipped") >= 5, "five rounds")
        text = quiet.scrape()
        assert "engram_relay_maintenance_rounds_total{" not in text
        assert sample(text, "engram_relay_tombstones_compacted_total") == 0


def test_a_failing_round_is_counted_and_the_relay_goes_on(relay: Relay) -> None:
    relay.sql("ALTER TABLE sessions RENAME TO sessions_away")
    try:
        wait_for(lambda: rounds(relay, "failed") >= 2, "two failed rounds")
        with client(relay) as http:
            assert http.get("/ready").status_code == 200
    finally:
        relay.sql("ALTER TABLE sessions_away RENAME TO sessions")
    ran = rounds(relay, "ran")
    wait_for(lambda: rounds(relay, "ran") > ran, "a round that runs again")


def test_shutdown_stops_a_round_that_waits_on_a_vault_lock(relay_config: RelayConfig) -> None:
    """A round blocked on a vault's row lock (a long push elsewhere) is cancelled when
    the relay stops: the stop completes and the maintenance lock is free afterwards."""
    server = RelayThread(relay_config).start()
    served = Relay(server.url, relay_config.database_url, relay_config)
    loop = asyncio.new_event_loop()
    blocker: asyncpg.Connection | None = None
    try:
        vault = tombstoned_vault(served)
        blocker = loop.run_until_complete(asyncpg.connect(to_libpq_url(served.database_url)))
        loop.run_until_complete(blocker.execute("BEGIN"))
        loop.run_until_complete(
            blocker.execute("SELECT 1 FROM vaults WHERE vault_id = $1 FOR UPDATE", vault)
        )
        age_tombstones(served, vault)  # only now: a round before the lock would compact it
        wait_for(
            lambda: bool(
                served.sql(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name = 'engram-relay'"
                    " AND wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE%'"
                )
            ),
            "the round to wait on the vault's row lock",
        )
        server.stop()
        assert not server.thread.is_alive(), "the relay did not stop"
        # the stopped relay's round let the maintenance lock go and rolled back
        assert loop.run_until_complete(
            blocker.fetchval("SELECT pg_try_advisory_lock($1)", MAINTENANCE_LOCK_KEY)
        )
        assert tombstones(served, vault) == 1
    finally:
        server.stop()
        if blocker is not None:
            loop.run_until_complete(blocker.close())
        loop.close()


def test_the_interval_comes_from_the_environment() -> None:
    url = "postgresql://unused@127.0.0.1:1/none"
    assert config_from_env(url, {}).maintenance_interval_secs == 300
    env = {"ENGRAM_RELAY_MAINTENANCE_INTERVAL_S": "0"}
    assert config_from_env(url, env).maintenance_interval_secs == 0
    with pytest.raises(ValueError, match="MAINTENANCE_INTERVAL_S must be >= 0"):
        config_from_env(url, {"ENGRAM_RELAY_MAINTENANCE_INTERVAL_S": "-1"})
    with pytest.raises(ValueError, match="must be an integer"):
        config_from_env(url, {"ENGRAM_RELAY_MAINTENANCE_INTERVAL_S": "soon"})


def test_a_relay_with_a_pool_of_one_connection_still_compacts(relay_config: RelayConfig) -> None:
    """The lock is held on a connection of its own: a round never waits for a second
    pooled connection, which a pool of one would never give it."""
    with serve(replace(relay_config, pool_max_size=1)) as small:
        vault = expired_tombstone(small)
        wait_for(lambda: tombstones(small, vault) == 0, "the expired tombstone to be compacted")
        with client(small) as http:
            assert http.get("/ready").status_code == 200
