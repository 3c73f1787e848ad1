"""A row the relay loses outside a push or a compaction (issue 35 part 3), end to end: real
relay, real SQLCipher vaults, the real `engram-sync` CLI.

The blob row is deleted from the relay's database by hand and the vault row left as it
was (a disk fault, a partial restore, a hand edit): the stored digest still claims the
version, so every device holding it is "in agreement". Two ways out, both tested:
`engram-sync verify --deep` compares with the digest computed from the rows
(`?deep=1`) and `--repair` pushes the version again; the relay's scrub makes the stored
digest true, and then a plain sync's anti-entropy check pushes it again.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.http.routes import system
from engram_sync.relay.store.scrub import scrub_vault
from tests.e2e.conftest import PASSPHRASE, VAULT_ID, DeviceHandle
from tests.e2e.helpers import add, contents, sync_all
from tests.relay.conftest import Relay

EXE = str(Path(sys.executable).parent / "engram-sync")


def _verify(device: DeviceHandle, *args: str) -> subprocess.CompletedProcess[str]:
    device.restart()  # the CLI opens the vault itself
    env = {**os.environ, "ENGRAM_PASSPHRASE": PASSPHRASE}
    env.pop("ENGRAM_VAULT", None)
    return subprocess.run(
        [EXE, "--vault", str(device.path), "verify", *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def _lose_row(relay: Relay, memory_id: str) -> None:
    """Only the blob row goes: the vault's digest, counts and prefixes still claim it."""
    relay.sql("DELETE FROM blobs WHERE vault_id = $1 AND memory_id = $2", VAULT_ID, memory_id)


def _on_relay(relay: Relay, memory_id: str) -> bool:
    rows = relay.sql(
        "SELECT 1 FROM blobs WHERE vault_id = $1 AND memory_id = $2", VAULT_ID, memory_id
    )
    return bool(rows)


def _scrub(relay: Relay) -> str:
    async def go() -> str:
        conn = await asyncpg.connect(to_libpq_url(relay.database_url))
        try:
            return (await scrub_vault(conn, VAULT_ID, 60_000)).outcome
        finally:
            await conn.close()

    return asyncio.run(go())


def test_plain_verify_agrees_where_verify_deep_finds_the_lost_row_and_repairs_it(
    devices: list[DeviceHandle], relay: Relay
) -> None:
    alpha, bravo, charlie = devices
    ids = [add(alpha, f"memory {i}") for i in range(4)]
    sync_all(alpha, bravo)
    honest = _verify(alpha, "--deep", "--json")  # the honest case: deep agrees too
    assert honest.returncode == 0, honest.stderr
    assert json.loads(honest.stdout)["matched"] is True
    _lose_row(relay, ids[2])
    plain = _verify(alpha)
    assert plain.returncode == 0, plain.stderr
    assert "in agreement" in plain.stdout  # the stored total still claims the row
    deep = _verify(alpha, "--deep", "--json")
    assert deep.returncode == 1, deep.stderr
    found = json.loads(deep.stdout)
    assert (found["matched"], found["relay_lacks"], found["requeued"]) == (False, 1, 0)
    assert found["relay_count"] == 3
    assert found["device_count"] == 4
    assert not _on_relay(relay, ids[2])  # without --repair nothing changes
    repaired = _verify(alpha, "--deep", "--repair", "--json")
    assert repaired.returncode == 0, repaired.stderr
    assert json.loads(repaired.stdout)["requeued"] == 1
    assert _on_relay(relay, ids[2])
    charlie.sync()
    assert contents(charlie) == contents(alpha)  # a fresh device gets the lost memory
    again = _verify(alpha, "--deep")
    assert again.returncode == 0, again.stderr
    assert "in agreement" in again.stdout


def test_after_the_scrub_the_next_sync_pushes_the_lost_version_again(
    devices: list[DeviceHandle], relay: Relay
) -> None:
    alpha, bravo, charlie = devices
    ids = [add(alpha, f"memory {i}") for i in range(4)]
    sync_all(alpha, bravo)
    _lose_row(relay, ids[1])
    report = alpha.sync()  # before the scrub: the stored total hides the loss
    assert report.digest is not None
    assert report.digest.matched
    assert report.pushed == 0
    assert _scrub(relay) == "repaired"
    report = bravo.sync()  # any device holding it: no manual step
    assert report.digest is not None
    assert report.digest.matched
    assert (report.digest.relay_lacks, report.digest.requeued, report.pushed) == (1, 1, 1)
    assert _on_relay(relay, ids[1])
    assert _scrub(relay) == "clean"
    charlie.sync()
    assert contents(charlie) == contents(alpha)


def test_verify_deep_against_a_relay_without_it_says_what_to_do(
    devices: list[DeviceHandle], monkeypatch: pytest.MonkeyPatch
) -> None:
    alpha = devices[0]
    add(alpha, "one")
    alpha.sync()
    monkeypatch.setattr(system, "FEATURES", [f for f in system.FEATURES if f != "digest-deep"])
    refused = _verify(alpha, "--deep")
    assert refused.returncode != 0
    line = refused.stderr.strip()
    assert "\n" not in line, refused.stderr
    assert "digest-deep" in line
    assert "without --deep" in line
    assert "Traceback" not in refused.stderr
    plain = _verify(alpha)  # and plain verify still works there
    assert plain.returncode == 0, plain.stderr
