"""Whole-vault scans are bounded (relay.scan_gate, docs/digest.md "Bounded scans").

The gate's admission is checked on its own (asyncio, no database); its statement timeout
against real PostgreSQL through a real relay: a vault of 60,000 rows is narrowed under a
1 ms timeout (the pass takes tens of milliseconds) and by a relay with the default one.
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import replace

import asyncpg
import httpx
import pytest

from engram_sync.relay.config import config_from_env
from engram_sync.relay.errors import RelayError
from engram_sync.relay.scan_gate import ScanGate
from engram_sync.shared_format.digest import PREFIX_BYTES, SUB_BUCKETS, bucket_of
from tests.relay.conftest import Relay, base_config
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    migrated_database,
    new_vault_id,
    pull_ok,
    push_ok,
    serve,
)

ROWS = 60_000


async def _hold(gate: ScanGate, entered: asyncio.Event, leave: asyncio.Event) -> None:
    async with gate.admit():
        entered.set()
        await leave.wait()


def test_the_gate_admits_up_to_its_cap_and_answers_busy_past_it() -> None:
    async def go() -> None:
        gate = ScanGate(running=1, waiting=1, timeout_s=5)
        leave = asyncio.Event()
        first, second = asyncio.Event(), asyncio.Event()
        running = asyncio.create_task(_hold(gate, first, leave))
        await first.wait()
        waiting = asyncio.create_task(_hold(gate, second, leave))
        await asyncio.sleep(0.01)
        assert not second.is_set()  # it waits for the one slot
        assert gate.stats.admitted == 2
        with pytest.raises(RelayError) as refused:
            async with gate.admit():
                raise AssertionError("a third scan was admitted past running + waiting")
        assert (refused.value.status, refused.value.code) == (503, "busy")
        assert refused.value.headers == {"Retry-After": "1"}
        leave.set()
        await asyncio.gather(running, waiting)
        assert second.is_set()  # the waiting one ran once the slot was free
        async with gate.admit():  # and a new one is admitted again
            assert gate.stats.admitted == 1
        assert (gate.stats.admitted, gate.stats.refused_busy) == (0, 1)

    asyncio.run(go())


def test_a_scan_waits_for_a_slot_no_longer_than_the_timeout() -> None:
    async def go() -> None:
        gate = ScanGate(running=1, waiting=4, timeout_s=0.05)
        entered, leave = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold(gate, entered, leave))
        await entered.wait()
        with pytest.raises(RelayError) as refused:
            async with gate.admit():
                raise AssertionError("admitted while the only slot was held")
        assert refused.value.code == "busy"
        leave.set()
        await holder
        async with gate.admit():
            pass
        assert gate.stats.admitted == 0

    asyncio.run(go())


def test_a_cancelled_statement_is_503_scan_timeout_and_other_errors_pass() -> None:
    async def go() -> None:
        gate = ScanGate(running=1, waiting=0, timeout_s=2)
        with pytest.raises(RelayError) as stopped:
            async with gate.admit():
                raise asyncpg.QueryCanceledError("canceling statement due to statement timeout")
        assert (stopped.value.status, stopped.value.code) == (503, "scan_timeout")
        assert "ENGRAM_RELAY_SCAN_TIMEOUT_S" in stopped.value.message
        assert stopped.value.headers == {"Retry-After": "5"}
        with pytest.raises(ValueError, match="other"):
            async with gate.admit():
                raise ValueError("other")
        assert (gate.stats.admitted, gate.stats.timed_out) == (0, 1)
        async with gate.admit():  # the slot came back both times
            pass

    asyncio.run(go())


def test_the_scan_settings_come_from_the_environment() -> None:
    config = config_from_env(
        "postgresql://x@h/db",
        {
            "ENGRAM_RELAY_SCAN_MAX_RUNNING": "3",
            "ENGRAM_RELAY_SCAN_MAX_WAITING": "0",
            "ENGRAM_RELAY_SCAN_TIMEOUT_S": "2.5",
        },
    )
    assert (config.scan_max_running, config.scan_max_waiting, config.scan_timeout_s) == (3, 0, 2.5)
    defaults = config_from_env("postgresql://x@h/db", {})
    assert (defaults.scan_max_running, defaults.scan_max_waiting) == (2, 8)
    assert defaults.scan_timeout_s == 20.0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ENGRAM_RELAY_SCAN_MAX_RUNNING", "0"),
        ("ENGRAM_RELAY_SCAN_MAX_WAITING", "-1"),
        ("ENGRAM_RELAY_SCAN_TIMEOUT_S", "0"),
        ("ENGRAM_RELAY_SCAN_TIMEOUT_S", "3601"),
        ("ENGRAM_RELAY_SCAN_TIMEOUT_S", "long"),
    ],
)
def test_bad_scan_settings_are_refused_naming_them(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        config_from_env("postgresql://x@h/db", {name: value})


def _fill(relay: Relay, vault: str) -> None:
    """ROWS more rows of `vault`, written directly (a push of as many takes seconds)."""
    relay.sql(
        "INSERT INTO blobs (vault_id, memory_id, device_id, vector_clock, ciphertext, hmac,"
        " created_at, created_at_ts, deleted, seq, size_bytes)"
        " SELECT $1, 'fill-' || g, 'dev-fill', 1, 'c', 'h', '2026-01-01T00:00:00Z', now(),"
        " false, 1000 + g, 1 FROM generate_series(1, $2::int) g",
        vault,
        ROWS,
    )


def _narrow(http: httpx.Client, vault: str, bucket: int) -> httpx.Response:
    subs = base64.b64encode(bytes(SUB_BUCKETS * PREFIX_BYTES)).decode()
    return http.post(f"/v1/vaults/{vault}/digest/narrow", json={"bucket": bucket, "subs": subs})


def test_a_scan_past_its_timeout_is_refused_and_the_relay_goes_on(postgres_url: str) -> None:
    with (
        migrated_database(postgres_url) as url,
        serve(replace(base_config(url), scan_timeout_s=0.001)) as strict,
        serve(base_config(url)) as default,
        client(strict) as tight,
        client(default) as roomy,
    ):
        vault = new_vault_id()
        push_ok(tight, vault, [Sealer(vault).blob("m1", 1)])
        _fill(strict, vault)
        bucket = bucket_of("m1")
        stopped = assert_error(_narrow(tight, vault, bucket), 503, "scan_timeout")
        assert "ENGRAM_RELAY_SCAN_TIMEOUT_S" in stopped["error"]
        answer = tight.get(f"/v1/vaults/{vault}/digest", params={"bucket": bucket})
        assert_error(answer, 503, "scan_timeout")
        assert answer.headers["retry-after"] == "5"
        # the database stopped the statements: nothing of them runs on, and the strict
        # relay's pooled connections still serve what needs no scan
        assert not strict.sql(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE '%engram_version_hash%'"
            " AND state = 'active' AND pid <> pg_backend_pid()"
        )
        whole = tight.get(f"/v1/vaults/{vault}/digest")
        assert whole.status_code == 200, whole.text
        assert pull_ok(tight, vault, cursor=0, limit=2)["has_more"]
        # the same requests under the default timeout are answered in full
        in_bucket = sum(bucket_of(f"fill-{g}") == bucket for g in range(1, ROWS + 1)) + 1
        narrowed = _narrow(roomy, vault, bucket)
        assert narrowed.status_code == 200, narrowed.text
        assert narrowed.json()["count"] == in_bucket
        digest = roomy.get(f"/v1/vaults/{vault}/digest", params={"bucket": bucket})
        assert digest.status_code == 200, digest.text
        assert digest.json()["count"] == in_bucket
