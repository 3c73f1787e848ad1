"""The scrub (relay.store.scrub, issue 35 part 3): a blob row the relay loses outside a push
or a compaction is found, counted, said and the stored digest made true again; `?deep=1`
answers the digest computed from the rows, through the scan gate.

Real relays over real HTTP on a real PostgreSQL; rows are deleted by hand (SQL) as a disk
fault, a partial restore or a hand edit would. The truth each test compares with is
computed here from the rows with hashlib (tests/relay/bucket_oracle.py's `_version`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import subprocess
import sys
import threading
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.services.config import RelayConfig, config_from_env
from engram_sync.relay.services.maintenance import ScrubPlan, maintenance_round
from engram_sync.relay.services.metrics import RelayMetrics
from engram_sync.relay.store.bucket_prefixes import count_list
from engram_sync.relay.store.scrub import scrub_vault
from engram_sync.shared_format.digest import bucket_of, digest_int, digest_text
from tests.relay.bucket_oracle import _version
from tests.relay.conftest import ADMIN_KEY, Relay, base_config
from tests.relay.services.test_maintenance import sample
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    migrated_database,
    new_vault_id,
    push_ok,
    serve,
    wait_for,
)

BIN = Path(sys.executable).parent
FAST = 0.05  # seconds between two maintenance rounds
ROWS = 60_000
RACE_ROWS, SCRUBS = 20_000, 10


@pytest.fixture
def relay_config(relay_config: RelayConfig) -> RelayConfig:
    # rounds every 50 ms; a vault is scrubbed again once 1 s has passed since its last
    return replace(relay_config, maintenance_interval_secs=FAST, scrub_interval_secs=1)


def truth(relay: Relay, vault: str) -> dict[str, Any]:
    """The vault's digest, counts, bucket prefixes and counts computed from its rows."""
    rows = relay.sql(
        "SELECT memory_id, device_id, vector_clock, deleted, size_bytes FROM blobs"
        " WHERE vault_id = $1",
        vault,
    )
    xors, counts, digest = [0] * 256, [0] * 256, 0
    for r in rows:
        v = _version(r["memory_id"], r["device_id"], r["vector_clock"], r["deleted"])
        bucket = hashlib.sha256(r["memory_id"].encode()).digest()[0]
        xors[bucket] ^= v
        counts[bucket] += 1
        digest ^= v
    dead = sum(1 for r in rows if r["deleted"])
    return {
        "digest": digest,
        "live": len(rows) - dead,
        "tombstones": dead,
        "prefixes": b"".join(x.to_bytes(32, "big")[:8] for x in xors),
        "counts": counts,
        "bytes": sum(r["size_bytes"] for r in rows),  # the quota's count (PROTOCOL §6)
    }


def stored(relay: Relay, vault: str) -> dict[str, Any]:
    (row,) = relay.sql(
        "SELECT digest, live_blobs, tombstones, bucket_prefixes, bucket_counts, bytes_used,"
        " scrubbed_at, scrub_mismatches FROM vaults WHERE vault_id = $1",
        vault,
    )
    return {
        "digest": digest_int(row["digest"]),
        "live": row["live_blobs"],
        "tombstones": row["tombstones"],
        "prefixes": bytes(row["bucket_prefixes"]),
        "counts": count_list(row["bucket_counts"]),
        "bytes": row["bytes_used"],
    }


def scrub_meta(relay: Relay, vault: str) -> tuple[Any, int]:
    (row,) = relay.sql(
        "SELECT scrubbed_at, scrub_mismatches FROM vaults WHERE vault_id = $1", vault
    )
    return row["scrubbed_at"], int(row["scrub_mismatches"])


def pushed_vault(relay: Relay, n: int = 5, *, tombstone: bool = True) -> tuple[str, Sealer]:
    vault = new_vault_id()
    sealer = Sealer(vault)
    with client(relay, relay.mint(vault, device_id=sealer.device_id)) as http:
        push_ok(http, vault, [sealer.blob(f"m{i}", 1) for i in range(n)])
        if tombstone:
            push_ok(http, vault, [sealer.blob("m0", 2, deleted=True)])
    return vault, sealer


def lose_row(relay: Relay, vault: str, memory_id: str) -> None:
    """A blob row gone outside a push or compaction: the vault row is left as it was."""
    relay.sql("DELETE FROM blobs WHERE vault_id = $1 AND memory_id = $2", vault, memory_id)


def relay_cli(relay: Relay, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if "DATABASE_URL" not in k}
    return subprocess.run(
        [str(BIN / "engram-relay"), *args, "--database-url", relay.database_url],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_clean_vault_is_scrubbed_and_left_alone(relay: Relay) -> None:
    vault, _ = pushed_vault(relay)
    before = stored(relay, vault)
    assert before == truth(relay, vault)
    wait_for(lambda: scrub_meta(relay, vault)[0] is not None, "the vault scrubbed")
    assert scrub_meta(relay, vault)[1] == 0
    assert stored(relay, vault) == before
    text = relay.scrape()
    assert sample(text, "engram_relay_scrubs_total", outcome="clean") >= 1
    assert sample(text, "engram_relay_scrub_mismatches_total") == 0


def test_a_row_deleted_by_hand_is_found_counted_and_the_digest_made_true(
    relay: Relay, caplog: pytest.LogCaptureFixture
) -> None:
    vault, _ = pushed_vault(relay)
    wait_for(lambda: scrub_meta(relay, vault)[0] is not None, "the first scrub")
    lose_row(relay, vault, "m3")
    assert stored(relay, vault) != truth(relay, vault)  # the running total still claims it
    with caplog.at_level("WARNING", logger="engram_sync.relay.services.maintenance"):
        wait_for(lambda: scrub_meta(relay, vault)[1] == 1, "the scrub to find the lost row")
        wait_for(
            lambda: any(getattr(r, "vault_id", None) == vault for r in caplog.records),
            "the log line naming the vault",
        )
    assert stored(relay, vault) == truth(relay, vault)
    line = next(r for r in caplog.records if getattr(r, "vault_id", None) == vault)
    assert vault in line.getMessage()
    assert "digest" in line.getMessage()
    assert (line.stored_count, line.row_count) == (5, 4)  # type: ignore[attr-defined]
    assert sample(relay.scrape(), "engram_relay_scrub_mismatches_total") == 1
    # once true it stays: the next scrubs find nothing more
    first = scrub_meta(relay, vault)[0]
    wait_for(lambda: scrub_meta(relay, vault)[0] != first, "another scrub")
    assert scrub_meta(relay, vault)[1] == 1
    with client(relay) as http:
        whole = http.get(f"/v1/vaults/{vault}/digest").json()
    assert (whole["count"], whole["digest"]) == (4, digest_text(truth(relay, vault)["digest"]))
    shown = relay_cli(relay, "vaults", "show", vault)
    assert shown.returncode == 0, shown
    assert "scrub mismatches: 1" in shown.stdout
    assert "last scrub: never" not in shown.stdout
    assert "last scrub: 20" in shown.stdout


def test_a_quota_count_gone_wrong_is_found_and_made_true(relay: Relay) -> None:
    # bytes_used is a running total too (the quota's, PROTOCOL §6): a hand edit or a
    # partial restore that leaves it wrong would refuse pushes to a vault under its quota,
    # or let one past it; the scrub makes it the rows' sum again and counts the mismatch
    vault, _ = pushed_vault(relay)
    wait_for(lambda: scrub_meta(relay, vault)[0] is not None, "the first scrub")
    assert stored(relay, vault) == truth(relay, vault)
    relay.sql("UPDATE vaults SET bytes_used = bytes_used + 999999 WHERE vault_id = $1", vault)
    wait_for(lambda: scrub_meta(relay, vault)[1] == 1, "the scrub to find the wrong count")
    assert stored(relay, vault) == truth(relay, vault)
    assert truth(relay, vault)["bytes"] > 0


def test_the_scrub_command_finds_and_repairs_now(postgres_url: str) -> None:
    # no background scrub in this relay: only the command
    with (
        migrated_database(postgres_url) as url,
        serve(replace(base_config(url), scrub_interval_secs=0)) as relay,
    ):
        vault, _ = pushed_vault(relay)
        other, _ = pushed_vault(relay)
        lose_row(relay, vault, "m2")
        fixed = relay_cli(relay, "scrub", vault)
        assert fixed.returncode == 0, fixed
        assert f"vault {vault}: stored digest disagreed with its rows" in fixed.stdout
        assert "1 mismatch(es) found and repaired" in fixed.stdout
        assert stored(relay, vault) == truth(relay, vault)
        assert scrub_meta(relay, other) == (None, 0)  # only the vault named
        every = relay_cli(relay, "scrub")
        assert every.returncode == 0, every
        assert "scrubbed 2 vault(s): 0 mismatch(es)" in every.stdout
        assert scrub_meta(relay, other)[0] is not None
        assert "scrub mismatches: 1" in relay_cli(relay, "vaults", "show", vault).stdout
        missing = relay_cli(relay, "scrub", "no-such-vault")
        assert missing.returncode != 0
        assert missing.stderr.strip().count("\n") == 0, missing.stderr
        assert "no vault 'no-such-vault'" in missing.stderr
        assert "Traceback" not in missing.stderr


def test_the_scrub_settings_come_from_the_environment() -> None:
    config = config_from_env(
        "postgresql://x@h/db",
        {"ENGRAM_RELAY_SCRUB_INTERVAL_S": "60", "ENGRAM_RELAY_SCRUB_PER_ROUND": "3"},
    )
    assert (config.scrub_interval_secs, config.scrub_per_round) == (60, 3)
    defaults = config_from_env("postgresql://x@h/db", {})
    assert (defaults.scrub_interval_secs, defaults.scrub_per_round) == (3600, 20)
    for name, value in (
        ("ENGRAM_RELAY_SCRUB_INTERVAL_S", "-1"),
        ("ENGRAM_RELAY_SCRUB_PER_ROUND", "0"),
    ):
        with pytest.raises(ValueError, match=name):
            config_from_env("postgresql://x@h/db", {name: value})


def _fill(relay: Relay, vault: str, rows: int = ROWS) -> None:
    """`rows` more rows of `vault` written directly, the vault row made true after."""
    relay.sql(
        "INSERT INTO blobs (vault_id, memory_id, device_id, vector_clock, ciphertext, hmac,"
        " created_at, created_at_ts, deleted, seq, size_bytes)"
        " SELECT $1, 'fill-' || g, 'dev-fill', 1, 'c', 'h', '2026-01-01T00:00:00Z', now(),"
        " false, 1000 + g, 1 FROM generate_series(1, $2::int) g",
        vault,
        rows,
    )


async def _scrub(url: str, vault: str, timeout_ms: int) -> Any:
    conn = await asyncpg.connect(to_libpq_url(url))
    try:
        return await scrub_vault(conn, vault, timeout_ms)
    finally:
        await conn.close()


def test_a_push_racing_the_scrub_is_kept_in_the_total(postgres_url: str) -> None:
    # A 20,000-row vault: each pass over its rows takes tens of milliseconds, while pushes
    # of one blob each commit without pause. Every push that commits while a scrub runs
    # must stay in the stored total (the scrub holds the vault row lock a push takes).
    with (
        migrated_database(postgres_url) as url,
        serve(replace(base_config(url), scrub_interval_secs=0)) as relay,
    ):
        vault, sealer = pushed_vault(relay, 1, tombstone=False)
        _fill(relay, vault, RACE_ROWS)
        assert asyncio.run(_scrub(url, vault, 60_000)).outcome == "repaired"  # the fill
        assert stored(relay, vault) == truth(relay, vault)
        stop = threading.Event()
        pushed: list[int] = []

        def pushes() -> None:
            with client(relay, relay.mint(vault, device_id=sealer.device_id)) as http:
                clock = 2
                while not stop.is_set():
                    push_ok(http, vault, [sealer.blob(f"race-{clock}", clock)])
                    pushed.append(clock)
                    clock += 1

        pusher = threading.Thread(target=pushes)
        pusher.start()
        try:
            wait_for(lambda: len(pushed) >= 3, "pushes under way")
            outcomes = [asyncio.run(_scrub(url, vault, 60_000)).outcome for _ in range(SCRUBS)]
        finally:
            stop.set()
            pusher.join()
        assert len(pushed) > 10
        assert outcomes == ["clean"] * SCRUBS  # no push seen half-done, none lost
        assert stored(relay, vault) == truth(relay, vault)
        assert stored(relay, vault)["live"] == RACE_ROWS + 1 + len(pushed)


def test_a_scrub_past_its_timeout_gives_up_cleanly_and_the_relay_goes_on(
    postgres_url: str,
) -> None:
    with (
        migrated_database(postgres_url) as url,
        serve(replace(base_config(url), scrub_interval_secs=0)) as relay,
    ):
        vault, sealer = pushed_vault(relay, 2, tombstone=False)
        _fill(relay, vault)
        before = stored(relay, vault)  # untrue: the fill is not in it
        metrics = RelayMetrics()

        async def round_() -> Any:
            pool = await asyncpg.create_pool(to_libpq_url(url), min_size=1, max_size=2)
            try:
                return await maintenance_round(
                    pool, url, timedelta(days=30), metrics,
                    ScrubPlan(interval_s=0, per_round=5, timeout_ms=1),
                )  # fmt: skip
            finally:
                await pool.close()

        done = asyncio.run(round_())
        assert done is not None  # the round ran; its scrub gave up
        assert [r.outcome for r in done.scrubbed] == ["timed_out"]
        text = metrics.render().decode()
        assert sample(text, "engram_relay_scrubs_total", outcome="timed_out") == 1
        assert sample(text, "engram_relay_maintenance_rounds_total", outcome="ran") == 1
        assert stored(relay, vault) == before  # rolled back: nothing half-written
        assert scrub_meta(relay, vault)[1] == 0
        assert scrub_meta(relay, vault)[0] is not None  # it goes behind the other vaults
        assert not relay.sql(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE '%engram_version_hash%'"
            " AND state = 'active' AND pid <> pg_backend_pid()"
        )
        with client(relay, relay.mint(vault, device_id=sealer.device_id)) as http:
            push_ok(http, vault, [sealer.blob("after", 5)])  # the vault row is not held
        # the same scrub with room enough does it
        assert asyncio.run(_scrub(url, vault, 60_000)).outcome == "repaired"
        assert stored(relay, vault) == truth(relay, vault)


# --- ?deep=1 ------------------------------------------------------------------------------


def test_an_honest_deep_digest_answers_as_the_stored_one(
    relay: Relay,
) -> None:
    vault, _ = pushed_vault(relay)
    with client(relay) as http:
        info = http.get("/v1/info").json()
        assert "digest-deep" in info["features"]
        stored_before = http.get(f"/v1/vaults/{vault}/digest").json()
        deep = http.get(f"/v1/vaults/{vault}/digest", params={"deep": 1}).json()
        assert deep == stored_before  # honest: the same answer
        every = http.get(f"/v1/vaults/{vault}/digest", params={"deep": 1, "buckets": 1}).json()
        assert every == http.get(f"/v1/vaults/{vault}/digest", params={"buckets": 1}).json()
        bad = http.get(f"/v1/vaults/{vault}/digest", params={"deep": 1, "bucket": 3})
        body = assert_error(bad, 400, "invalid_request")
        assert body.get("field") == "deep"
        assert_error(http.get(f"/v1/vaults/{vault}/digest", params={"deep": 2}), 400)


def test_deep_digest_sees_a_lost_row(postgres_url: str) -> None:
    with (
        migrated_database(postgres_url) as url,
        serve(replace(base_config(url), scrub_interval_secs=0)) as relay,
        client(relay) as http,
    ):
        vault, _ = pushed_vault(relay)
        plain_before = http.get(f"/v1/vaults/{vault}/digest").json()
        lose_row(relay, vault, "m3")
        true = truth(relay, vault)
        plain = http.get(f"/v1/vaults/{vault}/digest").json()
        assert plain == plain_before  # the running total still claims m3
        deep = http.get(f"/v1/vaults/{vault}/digest", params={"deep": 1}).json()
        assert (deep["count"], deep["digest"]) == (4, digest_text(true["digest"]))
        assert deep["cursor"] == plain["cursor"]
        every = http.get(f"/v1/vaults/{vault}/digest", params={"deep": 1, "buckets": 1}).json()
        assert base64.b64decode(every["buckets"]) == true["prefixes"]
        assert every["counts"] == true["counts"]
        assert every["counts"][bucket_of("m3")] == true["counts"][bucket_of("m3")]
        stored_every = http.get(f"/v1/vaults/{vault}/digest", params={"buckets": 1}).json()
        assert stored_every["counts"] != every["counts"]


FLOOD_KEY = "test-flood-key-0123456789abcdef"


def test_a_flood_of_deep_digests_is_bounded_by_the_scan_gate(postgres_url: str) -> None:
    # 12 threads ask ?deep=1 of a 60,000-row vault without pause: the gate admits one at a
    # time per vault (two more wait) and answers the rest 503 busy, naming the bound, and
    # never more than its places run in the database at once.
    from engram_sync.relay.domain.api_keys import parse_static_keys

    config = replace(
        base_config(""),
        static_keys=tuple(parse_static_keys(f"{ADMIN_KEY}:100000,{FLOOD_KEY}:100000")),
        scrub_interval_secs=0,
    )
    with migrated_database(postgres_url) as url, serve(replace(config, database_url=url)) as relay:
        vault, _ = pushed_vault(relay, 1, tombstone=False)
        _fill(relay, vault)
        stop = threading.Event()
        answers: list[httpx.Response] = []
        most = [0]

        def flood() -> None:
            with client(relay, FLOOD_KEY) as http:
                while not stop.is_set():
                    answers.append(http.get(f"/v1/vaults/{vault}/digest", params={"deep": 1}))

        def watch() -> None:
            while not stop.is_set():
                rows = relay.sql(
                    "SELECT count(*) AS n FROM pg_stat_activity WHERE state = 'active'"
                    " AND query LIKE '%engram_version_hash%' AND pid <> pg_backend_pid()"
                )
                most[0] = max(most[0], int(rows[0]["n"]))

        threads = [threading.Thread(target=flood) for _ in range(12)]
        watcher = threading.Thread(target=watch)
        for thread in [*threads, watcher]:
            thread.start()
        try:
            wait_for(lambda: len(answers) >= 40, "the flood answered")
            with client(relay) as mine:  # the operator's own key still gets an answer
                plain = mine.get(f"/v1/vaults/{vault}/digest")
        finally:
            stop.set()
            for thread in [*threads, watcher]:
                thread.join()
    assert plain.status_code == 200
    ok = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 503]
    assert ok
    assert refused
    assert all(a.json()["code"] == "busy" for a in refused), [a.text for a in refused][:3]
    assert all(a.json()["count"] == ROWS + 1 for a in ok)
    assert most[0] <= 1  # one vault: at most one pass at a time (ENGRAM_RELAY_SCAN_VAULT_RUNNING)


def test_a_round_scrubs_at_most_its_bound_least_recently_scrubbed_first(postgres_url: str) -> None:
    with (
        migrated_database(postgres_url) as url,
        serve(replace(base_config(url), scrub_interval_secs=0)) as relay,
    ):
        vaults = [pushed_vault(relay, 1, tombstone=False)[0] for _ in range(4)]
        # vaults[0] scrubbed long ago, [1] never, [2] just now (not due), [3] a while ago
        relay.sql(
            "UPDATE vaults SET scrubbed_at = now() - interval '3 hours' WHERE vault_id = $1",
            vaults[0],
        )
        relay.sql("UPDATE vaults SET scrubbed_at = now() WHERE vault_id = $1", vaults[2])
        relay.sql(
            "UPDATE vaults SET scrubbed_at = now() - interval '2 hours' WHERE vault_id = $1",
            vaults[3],
        )

        async def round_(per_round: int) -> list[str]:
            pool = await asyncpg.create_pool(to_libpq_url(url), min_size=1, max_size=2)
            try:
                done = await maintenance_round(
                    pool, url, timedelta(days=30), RelayMetrics(),
                    ScrubPlan(interval_s=3600, per_round=per_round, timeout_ms=60_000),
                )  # fmt: skip
            finally:
                await pool.close()
            assert done is not None
            return [r.vault_id for r in done.scrubbed]

        assert asyncio.run(round_(2)) == [vaults[1], vaults[0]]  # never, then the oldest
        assert asyncio.run(round_(2)) == [vaults[3]]  # the only one still due
        assert asyncio.run(round_(2)) == []  # every vault scrubbed within the interval
