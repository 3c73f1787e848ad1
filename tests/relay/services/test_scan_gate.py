"""Whole-vault scans are bounded (relay.services.scan_gate, docs/digest.md "Bounded scans").

The gate's admission is checked on its own (asyncio, no database); its statement timeout
against real PostgreSQL through a real relay: a vault of 60,000 rows is narrowed under a
1 ms timeout (the pass takes tens of milliseconds) and by a relay with the default one.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from dataclasses import replace

import asyncpg
import httpx
import pytest

from engram_sync.relay.domain.api_keys import parse_static_keys
from engram_sync.relay.domain.client_address import parse_trusted_proxies
from engram_sync.relay.domain.domain_errors import BusyError, ScanTimeoutError
from engram_sync.relay.domain.scan_admission import ScanClaim, ScanLimits
from engram_sync.relay.http.errors import answer_of_busy
from engram_sync.relay.services.config import config_from_env
from engram_sync.relay.services.scan_gate import ScanGate
from engram_sync.shared_format.digest import PREFIX_BYTES, SUB_BUCKETS, bucket_of
from tests.relay.conftest import ADMIN_KEY, Relay, base_config
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    migrated_database,
    new_vault_id,
    pull_ok,
    push_ok,
    serve,
    wait_for,
)

ROWS = 60_000


def _gate(running: int, waiting: int, timeout_s: float, **per: int) -> ScanGate:
    return ScanGate(ScanLimits(running, waiting, **per), timeout_s)


async def _hold(gate: ScanGate, entered: asyncio.Event, leave: asyncio.Event) -> None:
    async with gate.admit(ScanClaim("v")):
        entered.set()
        await leave.wait()


def test_the_gate_admits_up_to_its_cap_and_answers_busy_past_it() -> None:
    async def go() -> None:
        gate = _gate(1, 1, 5)
        leave = asyncio.Event()
        first, second = asyncio.Event(), asyncio.Event()
        running = asyncio.create_task(_hold(gate, first, leave))
        await first.wait()
        waiting = asyncio.create_task(_hold(gate, second, leave))
        await asyncio.sleep(0.01)
        assert not second.is_set()  # it waits for the one slot
        assert gate.stats.admitted == 2
        with pytest.raises(BusyError) as refused:
            async with gate.admit(ScanClaim("v")):
                raise AssertionError("a third scan was admitted past running + waiting")
        answer = answer_of_busy(refused.value)
        assert (answer.status, answer.code) == (503, "busy")
        assert answer.headers == {"Retry-After": "1"}
        leave.set()
        await asyncio.gather(running, waiting)
        assert second.is_set()  # the waiting one ran once the slot was free
        async with gate.admit(ScanClaim("v")):  # and a new one is admitted again
            assert gate.stats.admitted == 1
        assert (gate.stats.admitted, gate.stats.refused_busy) == (0, 1)

    asyncio.run(go())


def test_a_scan_waits_for_a_slot_no_longer_than_the_timeout() -> None:
    async def go() -> None:
        gate = _gate(1, 4, 0.05)
        entered, leave = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold(gate, entered, leave))
        await entered.wait()
        with pytest.raises(BusyError) as refused:
            async with gate.admit(ScanClaim("v")):
                raise AssertionError("admitted while the only slot was held")
        assert answer_of_busy(refused.value).code == "busy"
        leave.set()
        await holder
        async with gate.admit(ScanClaim("v")):
            pass
        assert gate.stats.admitted == 0

    asyncio.run(go())


def test_a_cancelled_statement_is_503_scan_timeout_and_other_errors_pass() -> None:
    async def go() -> None:
        gate = _gate(1, 0, 2)
        with pytest.raises(ScanTimeoutError) as stopped:
            async with gate.admit(ScanClaim("v")):
                raise asyncpg.QueryCanceledError("canceling statement due to statement timeout")
        answer = answer_of_busy(stopped.value)
        assert (answer.status, answer.code) == (503, "scan_timeout")
        assert "ENGRAM_RELAY_SCAN_TIMEOUT_S" in answer.message
        assert answer.headers == {"Retry-After": "5"}
        with pytest.raises(ValueError, match="other"):
            async with gate.admit(ScanClaim("v")):
                raise ValueError("other")
        assert (gate.stats.admitted, gate.stats.timed_out) == (0, 1)
        async with gate.admit(ScanClaim("v")):  # the slot came back both times
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
    per = config_from_env(
        "postgresql://x@h/db",
        {
            "ENGRAM_RELAY_SCAN_VAULT_RUNNING": "2",
            "ENGRAM_RELAY_SCAN_VAULT_WAITING": "0",
            "ENGRAM_RELAY_SCAN_MAX_PER_CLIENT": "6",
        },
    )
    assert per.scan_limits == ScanLimits(2, 8, vault_running=2, vault_waiting=0, per_client=6)
    defaults = config_from_env("postgresql://x@h/db", {})
    assert (defaults.scan_max_running, defaults.scan_max_waiting) == (2, 8)
    assert defaults.scan_limits == ScanLimits(2, 8, vault_running=1, vault_waiting=2, per_client=4)
    assert defaults.scan_timeout_s == 20.0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ENGRAM_RELAY_SCAN_MAX_RUNNING", "0"),
        ("ENGRAM_RELAY_SCAN_MAX_WAITING", "-1"),
        ("ENGRAM_RELAY_SCAN_VAULT_RUNNING", "0"),
        ("ENGRAM_RELAY_SCAN_VAULT_WAITING", "-1"),
        ("ENGRAM_RELAY_SCAN_MAX_PER_CLIENT", "0"),
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


FLOOD_KEY = "test-flood-key-0123456789abcdef"
FLOODERS = 12  # issue 31 finding 7: 12 narrowings at once kept the gate full
VICTIM_ASKS = 20


def _from(relay: Relay, key: str, address: str) -> httpx.Client:
    """A client of `key` at `address`, as a trusted proxy (127.0.0.1) would forward it."""
    http = client(relay, key)
    http.headers["X-Forwarded-For"] = address
    return http


def test_one_vaults_flood_of_narrowings_leaves_another_vault_its_bucket_digests(
    postgres_url: str,
) -> None:
    # Two clients, each its own key and address (X-Forwarded-For from a trusted hop):
    # the flood narrows its own 60,000-row vault from 12 threads at once, without pause,
    # while the victim asks its own vault's bucket digest 20 times, one after the other.
    keys = f"{ADMIN_KEY}:100000,{FLOOD_KEY}:100000"
    config = replace(
        base_config(""),
        static_keys=tuple(parse_static_keys(keys)),
        trusted_proxies=parse_trusted_proxies("127.0.0.1"),
    )
    with migrated_database(postgres_url) as url, serve(replace(config, database_url=url)) as relay:
        flood_vault, victim = new_vault_id("flood"), new_vault_id("victim")
        with _from(relay, FLOOD_KEY, "198.51.100.7") as http:
            push_ok(http, flood_vault, [Sealer(flood_vault).blob("m1", 1)])
        _fill(relay, flood_vault)
        stop = threading.Event()
        answers: list[httpx.Response] = []

        def flood() -> None:
            with _from(relay, FLOOD_KEY, "198.51.100.7") as http:
                while not stop.is_set():
                    answers.append(_narrow(http, flood_vault, bucket_of("m1")))

        flooders = [threading.Thread(target=flood) for _ in range(FLOODERS)]
        with _from(relay, ADMIN_KEY, "203.0.113.9") as mine:
            push_ok(mine, victim, [Sealer(victim).blob("mine", 1)])
            for thread in flooders:
                thread.start()
            try:
                wait_for(lambda: len(answers) >= FLOODERS, "the flood under way")
                digests = [
                    mine.get(f"/v1/vaults/{victim}/digest", params={"bucket": bucket_of("mine")})
                    for _ in range(VICTIM_ASKS)
                ]
            finally:
                stop.set()
                for thread in flooders:
                    thread.join()
    assert [d.status_code for d in digests] == [200] * VICTIM_ASKS, [d.text for d in digests]
    assert all(d.json()["count"] == 1 for d in digests)
    # the flood itself was answered, and refused past its vault's places, naming them
    assert any(a.status_code == 200 for a in answers)
    refused = [a for a in answers if a.status_code == 503]
    assert refused
    assert all(a.json()["code"] == "busy" for a in refused)
    assert any("ENGRAM_RELAY_SCAN_VAULT_WAITING" in a.json()["error"] for a in refused)
