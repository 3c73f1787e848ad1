"""Vault retirement (PROTOCOL §19, docs/rekey.md "Relay") on a real relay and PostgreSQL.

From the retire on, every push to the old vault is refused 410 `vault_retired`, pushes
racing the retire included: the retire and the pushes take the same row lock, and the
push reads the retirement in its locking statement, so a push either committed before
the retire did (its sequence is at most the vault's at the retire) or was refused.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.domain.domain_errors import VaultRetiredError
from engram_sync.relay.domain.push_rules import check_structure
from engram_sync.relay.services.maintenance import sweep
from engram_sync.relay.store import retire as retire_store
from engram_sync.relay.store.push import PushJob, PushLimits, PushOutcome, Quota, push_group
from engram_sync.shared_format.handoff import new_handoff_keypair
from tests.relay.accounts.helpers import signup
from tests.relay.conftest import Relay
from tests.relay.sse import Message, messages, next_event
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    module_relay_fixture,
    new_device_id,
    new_vault_id,
    pull,
    pull_ok,
    push,
    push_ok,
    run_db,
    wait_for_lock_waiters,
)

relay = module_relay_fixture()

LIMITS = PushLimits(max_blob_bytes=1_048_576, default_quota=Quota(0, 0))


@pytest.fixture
def http(relay: Relay) -> Iterator[httpx.Client]:
    with client(relay) as c:
        yield c


def retire(http: httpx.Client, vault: str, successor: str | None) -> httpx.Response:
    return http.post(f"/v1/vaults/{vault}/retire", json={"successor": successor})


def retire_ok(http: httpx.Client, vault: str, successor: str | None) -> dict[str, Any]:
    response = retire(http, vault, successor)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def vault_seq(relay: Relay, vault: str) -> int:
    return int(relay.sql("SELECT seq FROM vaults WHERE vault_id = $1", vault)[0]["seq"])


def assert_retired_refusal(response: httpx.Response, successor: str | None) -> None:
    body = assert_error(response, 410, "vault_retired")
    assert body["successor"] == successor
    assert set(body) == {"error", "code", "successor"}


# --- the retire route ---------------------------------------------------------------------


def test_retire_refuses_every_push_and_names_the_successor(http: httpx.Client) -> None:
    old, new = new_vault_id("old"), new_vault_id("new")
    sealer = Sealer(old)
    assert push_ok(http, old, sealer.blobs(3))["accepted"] == 3  # the positive case
    body = retire_ok(http, old, new)
    assert body["vault_id"] == old
    assert body["successor"] == new
    assert body["retired_at"].endswith("+00:00")
    assert body["erase_after"] > body["retired_at"]
    for blobs in ([sealer.blob("fresh", 1)], [sealer.blob("mem-0", 9)], sealer.blobs(5, clock=7)):
        assert_retired_refusal(push(http, old, blobs), new)
    assert len(pull_ok(http, old, cursor=0)["blobs"]) == 3  # nothing of them was written
    assert push_ok(http, new, Sealer(new).blobs(1))["accepted"] == 1  # the successor is live


def test_retire_without_a_successor(http: httpx.Client) -> None:
    old = new_vault_id("alone")
    push_ok(http, old, Sealer(old).blobs(1))
    assert retire_ok(http, old, None)["successor"] is None
    assert_retired_refusal(push(http, old, Sealer(old).blobs(1, prefix="x")), None)


def test_retire_of_a_vault_nobody_used_refuses_its_first_push(http: httpx.Client) -> None:
    old = new_vault_id("unused")
    retire_ok(http, old, None)
    assert_retired_refusal(push(http, old, Sealer(old).blobs(1)), None)


def test_retire_is_idempotent_and_another_successor_is_409(http: httpx.Client) -> None:
    old, new, other = new_vault_id("old"), new_vault_id("new"), new_vault_id("other")
    push_ok(http, old, Sealer(old).blobs(1))
    first = retire_ok(http, old, new)
    assert retire_ok(http, old, new) == first  # the same values, not a new retired_at
    conflict = assert_error(retire(http, old, other), 409, "already_retired")
    assert conflict["successor"] == new
    assert_error(retire(http, old, None), 409, "already_retired")
    assert retire_ok(http, old, new) == first  # the 409s changed nothing


def test_retire_needs_an_admin_key_of_the_vault(relay: Relay, http: httpx.Client) -> None:
    old = new_vault_id("admin")
    push_ok(http, old, Sealer(old).blobs(1))
    member = relay.mint(old)  # a key for the vault, not an admin one
    with client(relay, member) as c:
        assert push_ok(c, old, Sealer(old).blobs(1, prefix="m"))["accepted"] == 1
        assert_error(retire(c, old, None), 403)
    other_admin = relay.mint(new_vault_id("elsewhere"), admin=True)
    with client(relay, other_admin) as c:
        assert_error(retire(c, old, None), 403)
    admin = relay.mint(old, admin=True)  # the positive case beside them
    with client(relay, admin) as c:
        assert retire_ok(c, old, None)["vault_id"] == old


def test_the_successor_must_be_a_vault_the_caller_may_use(relay: Relay, http: httpx.Client) -> None:
    old, mine, theirs = new_vault_id("old"), new_vault_id("mine"), new_vault_id("theirs")
    push_ok(http, old, Sealer(old).blobs(1))
    admin_of_old = relay.mint(old, admin=True)  # a minted key reaches one vault only
    with client(relay, admin_of_old) as c:
        refused = assert_error(retire(c, old, theirs), 403, "successor_forbidden")
        assert theirs in refused["error"]
    assert push_ok(http, old, Sealer(old).blobs(1, prefix="still"))["accepted"] == 1  # live
    # An operator key reaches every vault: the same retire is allowed.
    assert retire_ok(http, old, mine)["successor"] == mine


@pytest.mark.parametrize(
    ("body", "field"),
    [({"successor": ""}, "successor"), ({"successor": 7}, "successor"), ({}, "successor")],
)
def test_a_bad_retire_body_is_a_400_naming_the_field(
    http: httpx.Client, body: dict[str, Any], field: str
) -> None:
    old = new_vault_id("body")
    response = http.post(f"/v1/vaults/{old}/retire", json=body)
    assert assert_error(response, 400)["field"] == field
    assert push_ok(http, old, Sealer(old).blobs(1))["accepted"] == 1  # not retired


def test_a_vault_cannot_be_its_own_successor(http: httpx.Client) -> None:
    old = new_vault_id("self")
    assert assert_error(retire(http, old, old), 400, "invalid_request")["field"] == "successor"
    assert push_ok(http, old, Sealer(old).blobs(1))["accepted"] == 1


def test_a_revoked_device_learns_nothing_of_the_retirement(
    relay: Relay, http: httpx.Client
) -> None:
    """PROTOCOL §19: devices bound to revoked keys learn nothing new, not even the
    successor: their keys get 403 `device_revoked` before any 410."""
    old, new = new_vault_id("revoked"), new_vault_id("hidden")
    kept, gone = new_device_id(), new_device_id()
    kept_key, gone_key = relay.mint(old, device_id=kept), relay.mint(old, device_id=gone)
    push_ok(http, old, Sealer(old).blobs(1))
    assert http.delete(f"/v1/vaults/{old}/devices/{gone}").status_code == 200
    retire_ok(http, old, new)
    with client(relay, gone_key) as c:
        for answer in (push(c, old, [Sealer(old).blob("x", 1, device_id=gone)]),
                       pull(c, old, cursor=0)):  # fmt: skip
            body = assert_error(answer, 403, "device_revoked")
            assert new not in answer.text
            assert "successor" not in body
    with client(relay, kept_key) as c:  # the positive case: a live device is told
        assert_retired_refusal(push(c, old, [Sealer(old).blob("y", 1, device_id=kept)]), new)
        assert pull_ok(c, old, cursor=0)["retired"]["successor"] == new


# --- pushes racing the retire ---------------------------------------------------------------


def test_a_push_queued_behind_the_retire_is_refused(relay: Relay, http: httpx.Client) -> None:
    """Deterministic interleaving: a first push commits, then the test holds the vault's
    row lock while the retire, then another push queue for it. The push queued after the
    retire must be refused even though it started before the retire committed (a
    retirement read outside the lock lets it through). (The first push used to queue
    ahead of the retire too; its commit updates the row, and the two waiters behind it
    then race for the new row version in PostgreSQL, either may win: the CI run of
    b22a8fc saw the push win. The test's lock holder never updates the row.)"""
    vault, successor = new_vault_id("race"), new_vault_id("next")
    sealer = Sealer(vault)
    push_ok(http, vault, sealer.blobs(1, prefix="seed"))
    name = f"retire-race-{vault}"[:60]

    def job(prefix: str) -> list[PushJob]:
        return [PushJob(vault, check_structure(sealer.blobs(2, prefix=prefix), 1000), None)]

    async def race() -> tuple[list[Any], int]:
        url = to_libpq_url(relay.database_url)
        pool = await asyncpg.create_pool(
            url, min_size=3, max_size=3, server_settings={"application_name": name}
        )
        gate = await asyncpg.connect(url)
        try:
            [before] = await push_group(pool, job("before"), LIMITS)  # committed first
            async with gate.transaction():
                await gate.execute("SELECT 1 FROM vaults WHERE vault_id = $1 FOR UPDATE", vault)
                retired = asyncio.ensure_future(
                    retire_store.retire(pool, vault, successor, timedelta(days=30))
                )
                await wait_for_lock_waiters(gate, name, 1)
                after = asyncio.ensure_future(push_group(pool, job("after"), LIMITS))
                await wait_for_lock_waiters(gate, name, 2)
            results = [before, await retired, (await after)[0]]
            seq_at_retire = int(
                await gate.fetchval("SELECT seq FROM vaults WHERE vault_id = $1", vault)
            )
            return results, seq_at_retire
        finally:
            await gate.close()
            await pool.close()

    (before, retired, after), seq_at_retire = asyncio.run(race())
    assert isinstance(before, PushOutcome)
    assert len(before.plan.accepted) == 2
    assert before.cursor <= seq_at_retire  # committed before the retire
    assert retired.successor == successor
    assert isinstance(after, VaultRetiredError), after  # queued behind the retire: refused
    assert after.successor == successor
    assert vault_seq(relay, vault) == seq_at_retire == 3  # seed + the two before
    memories = {b["memory_id"] for b in pull_ok(http, vault, cursor=0)["blobs"]}
    assert not any(m.startswith("after") for m in memories)


def test_concurrent_pushes_while_retiring_commit_before_it_or_get_410(
    relay: Relay, http: httpx.Client
) -> None:
    """Real HTTP: pushers keep pushing while an admin retires. Every push either got 200
    (and then its cursor is at most the vault's sequence at the retire) or 410, and every
    push sent after the retire answered is a 410."""
    vault, successor = new_vault_id("storm"), new_vault_id("after")
    push_ok(http, vault, Sealer(vault).blobs(1, prefix="seed"))
    pushers, max_rounds = 6, 500  # a bound, never reached when things work
    started = threading.Barrier(pushers + 1)
    retired = threading.Event()
    outcomes: list[tuple[bool, int, dict[str, Any]]] = []  # (sent after retire?, status, body)
    lock = threading.Lock()

    def pusher(index: int) -> None:
        sealer = Sealer(vault)
        with client(relay) as c:
            started.wait()
            pushed_after = 0
            for r in range(max_rounds):  # until two pushes each were sent after the retire
                after = retired.is_set()
                response = push(c, vault, sealer.blobs(3, prefix=f"p{index}-r{r}"))
                with lock:
                    outcomes.append((after, response.status_code, response.json()))
                pushed_after += after
                if pushed_after >= 2:
                    return

    with ThreadPoolExecutor(pushers) as pool:
        futures = [pool.submit(pusher, i) for i in range(pushers)]
        started.wait()
        body = retire_ok(http, vault, successor)
        seq_at_retire = vault_seq(relay, vault)  # read after the retire committed
        retired.set()
        for future in futures:
            future.result()
    assert body["successor"] == successor
    statuses = {status for _, status, _ in outcomes}
    assert statuses <= {200, 410}, statuses
    accepted = 0
    for sent_after, status, answer in outcomes:
        if status == 200:
            assert not sent_after, answer
            assert answer["cursor"] <= seq_at_retire, (answer, seq_at_retire)
            accepted += answer["accepted"]
        else:
            assert answer["code"] == "vault_retired"
            assert answer["successor"] == successor
    assert sum(1 for a, _, _ in outcomes if a) == 2 * pushers  # pushes after the retire
    assert vault_seq(relay, vault) == seq_at_retire == 1 + accepted  # nothing after it


# --- pulls during the grace period, erasure after it ---------------------------------------


def test_pulls_of_a_retired_vault_carry_retired_and_a_live_one_does_not(
    http: httpx.Client,
) -> None:
    old, new = new_vault_id("graced"), new_vault_id("succ")
    push_ok(http, old, Sealer(old).blobs(2))
    live = pull_ok(http, old, cursor=0)
    assert "retired" not in live
    assert "retired" not in pull_ok(http, old)
    body = retire_ok(http, old, new)
    expected = {"successor": new, "erase_after": body["erase_after"]}
    cursor_mode = pull_ok(http, old, cursor=0)
    assert cursor_mode["retired"] == expected
    assert len(cursor_mode["blobs"]) == 2  # still served during the grace period
    assert pull_ok(http, old, cursor=cursor_mode["cursor"])["retired"] == expected
    since_mode = pull_ok(http, old)
    assert since_mode["retired"] == expected
    assert len(since_mode["blobs"]) == 2


def test_after_the_grace_period_the_blobs_are_erased_and_pull_is_410(
    relay: Relay, http: httpx.Client
) -> None:
    old, new, live = new_vault_id("erased"), new_vault_id("succ"), new_vault_id("live")
    push_ok(http, old, Sealer(old).blobs(4))
    push_ok(http, live, Sealer(live).blobs(2))
    wrap = {"wrapped_k": "A" * 124, "prf_salt": "A" * 44}  # a passkey wrap (docs/web-vault.md)
    assert http.put(f"/v1/vaults/{old}/passkeys/AAAA", json=wrap).status_code == 200
    retire_ok(http, old, new)
    for method, path, body in VAULT_READS:  # within the grace period: they all answer
        answer = http.request(method, path.format(v=old), json=body)
        assert answer.status_code == 200, (path, answer.text)
    # its grace period over: erase_after = retired_at, as a grace of 0 gives (no
    # `retired_at - interval`: Citus refuses a STABLE function of a column in an UPDATE)
    relay.sql("UPDATE vaults SET erase_after = retired_at WHERE vault_id = $1", old)
    assert_retired_refusal(pull(http, old, cursor=0), new)  # 410 at once, erased or not
    assert_retired_refusal(pull(http, old), new)

    async def run_sweep(conn: asyncpg.Connection) -> dict[str, int]:
        return (await sweep(conn, timedelta(days=30))).erased

    erased = run_db(relay.database_url, run_sweep)
    assert erased["retired_vaults"] >= 1
    assert relay.sql("SELECT count(*) AS n FROM blobs WHERE vault_id = $1", old)[0]["n"] == 0
    wraps = relay.sql("SELECT count(*) AS n FROM vault_passkey_wraps WHERE vault_id = $1", old)
    assert wraps[0]["n"] == 0  # K's passkey wraps go with the vault
    row = relay.sql(
        "SELECT live_blobs, tombstones, bytes_used, successor FROM vaults WHERE vault_id = $1", old
    )[0]
    assert (row["live_blobs"], row["tombstones"], row["bytes_used"]) == (0, 0, 0)
    assert row["successor"] == new  # the row stays, a tombstone of the retirement
    assert_retired_refusal(pull(http, old, cursor=0), new)
    assert_retired_refusal(push(http, old, Sealer(old).blobs(1)), new)
    for method, path, body in VAULT_READS:  # every route of the vault
        assert_retired_refusal(http.request(method, path.format(v=old), json=body), new)
    device = new_device_id()
    registered = http.post(f"/v1/vaults/{old}/devices/register", json={"device_id": device,
                                                                      "label": "x"})  # fmt: skip
    assert_retired_refusal(registered, new)
    assert_retired_refusal(http.delete(f"/v1/vaults/{old}/devices/{device}"), new)
    assert len(pull_ok(http, live, cursor=0)["blobs"]) == 2  # other vaults untouched
    assert run_db(relay.database_url, run_sweep)["retired_vaults"] == 0  # done once


# Reads that keep working during the grace period and answer 410 after it (PROTOCOL §19).
VAULT_READS: list[tuple[str, str, Any]] = [
    ("GET", "/v1/vaults/{v}/stats", None),
    ("GET", "/sync/{v}/stats", None),
    ("GET", "/v1/vaults/{v}/devices", None),
    ("GET", "/v1/vaults/{v}/digest", None),
    ("POST", "/v1/vaults/{v}/fetch", {"memory_ids": ["mem-0"]}),
    ("GET", "/v1/vaults/{v}/passkeys", None),  # docs/web-vault.md "Passkey unlock"
]


def test_a_vault_within_its_grace_period_is_not_erased(relay: Relay, http: httpx.Client) -> None:
    old = new_vault_id("kept")
    push_ok(http, old, Sealer(old).blobs(3))
    retire_ok(http, old, None)

    async def run_sweep(conn: asyncpg.Connection) -> dict[str, int]:
        return (await sweep(conn, timedelta(days=30))).erased

    run_db(relay.database_url, run_sweep)
    assert len(pull_ok(http, old, cursor=0)["blobs"]) == 3


# --- nothing new for a retired vault: keys, pairing codes, handoff requests, events --------


def test_an_account_retires_into_its_own_vault_and_mints_no_key_for_the_old_one(
    relay: Relay,
) -> None:
    owner = signup(relay)
    old, new, foreign = new_vault_id("acct-old"), new_vault_id("acct-new"), new_vault_id("f")
    with owner.client(relay) as session:
        minted = session.post("/account/keys", json={"vault_id": old})
        assert minted.status_code == 200, minted.text
        assert session.post("/account/keys", json={"vault_id": new}).status_code == 200
    with client(relay) as operator:  # an id the operator uses, not the account
        push_ok(operator, foreign, Sealer(foreign).blobs(1))
    with client(relay, minted.json()["key"]) as admin:
        push_ok(admin, old, Sealer(old).blobs(1))
        assert_error(retire(admin, old, foreign), 403, "successor_forbidden")
        assert retire_ok(admin, old, new)["successor"] == new  # the account owns `new`
    with owner.client(relay) as session:
        assert_retired_refusal(session.post("/account/keys", json={"vault_id": old}), new)
        assert session.post("/account/keys", json={"vault_id": new}).status_code == 200


def test_pairing_codes_and_handoff_requests_are_refused_for_a_retired_vault(
    relay: Relay, http: httpx.Client
) -> None:
    old, live = new_vault_id("pair-old"), new_vault_id("pair-live")
    member = relay.mint(old)
    public_key = new_handoff_keypair().public_key_b64url
    handoff = {"public_key": public_key, "label": "laptop"}
    push_ok(http, old, Sealer(old).blobs(1))
    code = http.post(f"/v1/vaults/{old}/pairing-codes", json={}).json()["code"]
    with client(relay, member) as c:  # before the retire: both work
        assert c.post(f"/v1/vaults/{old}/handoff", json=handoff).status_code == 200
    retire_ok(http, old, live)
    assert_retired_refusal(http.post(f"/v1/vaults/{old}/pairing-codes", json={}), live)
    with client(relay, member) as c:
        assert_retired_refusal(c.post(f"/v1/vaults/{old}/handoff", json=handoff), live)
    redeemed = http.post("/pair/redeem", json={"code": code, "device_id": new_device_id()})
    assert_error(redeemed, 410, "code_invalid")  # the retire removed the unused code
    assert http.post(f"/v1/vaults/{live}/pairing-codes", json={}).status_code == 200


def test_the_event_stream_of_a_retired_vault_says_retired_and_ends(
    relay: Relay, http: httpx.Client
) -> None:
    old, new = new_vault_id("ev-old"), new_vault_id("ev-new")
    push_ok(http, old, Sealer(old).blobs(2))
    with http.stream("GET", f"/v1/vaults/{old}/events", params={"cursor": 0}) as response:
        feed = messages(response)  # live: retry, then the change at once
        assert next(feed) == Message(retry=2000)
        assert next_event(feed) == Message(event="change", data='{"cursor":2}')
    body = retire_ok(http, old, new)
    with http.stream("GET", f"/v1/vaults/{old}/events", params={"cursor": 0}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        received = list(messages(response))  # the stream ends by itself
    assert received[0] == Message(retry=2000)
    assert received[1].event == "retired"
    assert received[1].json() == {"successor": new, "erase_after": body["erase_after"]}
    assert len(received) == 2
    relay.sql("UPDATE vaults SET erase_after = retired_at WHERE vault_id = $1", old)
    gone = http.get(f"/v1/vaults/{old}/events", params={"cursor": 0})
    assert_retired_refusal(gone, new)


# --- the operator's command ---------------------------------------------------------------


def relay_cli(relay: Relay, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if "DATABASE_URL" not in k}
    return subprocess.run(
        [str(Path(sys.executable).parent / "engram-relay"), "vaults", "retire", *args,
         "--database-url", relay.database_url],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_engram_relay_vaults_retire(relay: Relay, http: httpx.Client) -> None:
    old, new, other = new_vault_id("cli-old"), new_vault_id("cli-new"), new_vault_id("cli-x")
    push_ok(http, old, Sealer(old).blobs(1))
    done = relay_cli(relay, old, "--successor", new, "--grace-days", "7")
    assert done.returncode == 0, done
    assert f"vault {old} retired (successor {new})" in done.stdout
    assert_retired_refusal(push(http, old, Sealer(old).blobs(1, prefix="x")), new)
    row = relay.sql("SELECT erase_after - retired_at AS grace FROM vaults WHERE vault_id = $1", old)
    assert row[0]["grace"] == timedelta(days=7)
    assert relay_cli(relay, old, "--successor", new).returncode == 0  # idempotent
    refused = relay_cli(relay, old, "--successor", other)
    assert refused.returncode != 0
    assert f"already retired with successor {new}" in refused.stderr
    assert "Traceback" not in refused.stderr
