"""Anti-entropy end to end (PROTOCOL §18, docs/digest.md): real relay, real vaults.

Every sync compares the device's digest with the relay's and repairs a mismatch: a row
that went missing from a device's database outside engram-sync comes back, a version the
relay lost is pushed again, a compacted tombstone stops counting. `engram-sync verify`
exits non-zero on a mismatch it did not repair.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import asyncpg

from engram_sync.client._sync.reports import DigestReport
from engram_sync.client._vault.held_versions import held_versions
from engram_sync.relay.store.bucket_prefixes import PREFIX_SHIFT, apply_changes
from engram_sync.relay.store.compaction import compact_vault
from engram_sync.shared_format.digest import (
    bucket_of,
    digest_bytes,
    digest_int,
    fold,
    version_hash,
)
from tests.e2e.conftest import PASSPHRASE, VAULT_ID, DeviceHandle
from tests.e2e.helpers import add, contents, delete, sync_all
from tests.relay.conftest import Relay
from tests.relay.support import run_db

EXE = str(Path(sys.executable).parent / "engram-sync")


def _digest(report_digest: DigestReport | None) -> DigestReport:
    assert report_digest is not None  # the relay offers `digest`: every sync checks
    return report_digest


def _device_digest(device: DeviceHandle) -> tuple[int, int]:
    with device.open() as session:
        return fold(held_versions(session.vault.conn))


def _relay_digest(relay: Relay) -> tuple[int, int]:
    async def work(conn: asyncpg.Connection) -> tuple[int, int]:
        row = await conn.fetchrow(
            "SELECT digest, live_blobs + tombstones AS n FROM vaults WHERE vault_id = $1",
            VAULT_ID,
        )
        return digest_int(row["digest"]), int(row["n"])

    return run_db(relay.database_url, work)


def _lose_on_relay(relay: Relay, memory_id: str) -> None:
    """The relay loses one memory consistently (as a restore from an older backup would:
    its digest, counts and bucket prefixes and counts without it, revision 0012)."""

    async def work(conn: asyncpg.Connection) -> None:
        async with conn.transaction():
            row = await conn.fetchrow(
                "DELETE FROM blobs WHERE vault_id = $1 AND memory_id = $2"
                " RETURNING device_id, vector_clock, deleted",
                VAULT_ID,
                memory_id,
            )
            vault = await conn.fetchrow(
                "SELECT digest, bucket_prefixes, bucket_counts FROM vaults WHERE vault_id = $1",
                VAULT_ID,
            )
            lost = version_hash(memory_id, row["device_id"], row["vector_clock"], row["deleted"])
            bucket = bucket_of(memory_id)
            prefixes, counts = apply_changes(
                vault["bucket_prefixes"],
                vault["bucket_counts"],
                {bucket: lost >> PREFIX_SHIFT},
                {bucket: -1},
            )
            await conn.execute(
                "UPDATE vaults SET digest = $2, live_blobs = live_blobs - 1,"
                " bucket_prefixes = $3, bucket_counts = $4 WHERE vault_id = $1",
                VAULT_ID,
                digest_bytes(digest_int(vault["digest"]) ^ lost),
                prefixes,
                counts,
            )

    run_db(relay.database_url, work)


def test_synced_devices_and_the_relay_agree(devices: list[DeviceHandle], relay: Relay) -> None:
    alpha, bravo, _ = devices
    ids = [add(alpha, f"memory {i}") for i in range(6)]
    add(bravo, "bravo's own")
    delete(alpha, ids[0])
    sync_all(alpha, bravo)
    report = alpha.sync()
    digest = _digest(report.digest)
    assert digest.matched
    assert digest.round_trips == 1  # one small answer when nothing differs
    assert digest.buckets == []
    assert _device_digest(alpha) == _device_digest(bravo) == _relay_digest(relay)
    assert _relay_digest(relay)[1] == 7  # 5 live, 1 tombstone, bravo's


def test_a_row_missing_from_a_device_database_comes_back(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    ids = [add(alpha, f"memory {i}") for i in range(6)]
    sync_all(alpha, bravo)
    before = contents(bravo)
    with bravo.open() as session:  # issue 16: a row deleted outside engram-sync
        session.vault.conn.execute("DELETE FROM engrams WHERE id = ?", (ids[2],))
    assert ids[2] not in contents(bravo)
    digest = _digest(bravo.sync().digest)
    assert digest.matched
    assert (digest.device_lacks, digest.restored, digest.relay_lacks) == (1, 1, 0)
    assert len(digest.buckets) == 1
    assert contents(bravo) == before
    assert _digest(bravo.sync().digest).round_trips == 1  # and it stays in agreement


def test_a_version_the_relay_lost_is_pushed_again(
    devices: list[DeviceHandle], relay: Relay
) -> None:
    alpha, bravo, charlie = devices
    ids = [add(alpha, f"memory {i}") for i in range(4)]
    sync_all(alpha, bravo)
    _lose_on_relay(relay, ids[1])
    report = alpha.sync()
    digest = _digest(report.digest)
    assert digest.matched
    assert (digest.relay_lacks, digest.requeued) == (1, 1)
    assert report.pushed == 1
    charlie.sync()
    assert contents(charlie) == contents(alpha)  # the lost memory reached a new device


def test_a_compacted_tombstone_stops_counting(devices: list[DeviceHandle], relay: Relay) -> None:
    alpha, bravo, _ = devices
    ids = [add(alpha, f"memory {i}") for i in range(3)]
    sync_all(alpha, bravo)
    delete(alpha, ids[0])
    sync_all(alpha, bravo)

    async def work(conn: asyncpg.Connection) -> int:
        await conn.execute("UPDATE blobs SET received_at = now() - interval '40 days'")
        await conn.execute("UPDATE devices SET last_seen = now() - interval '40 days'")
        return (await compact_vault(conn, VAULT_ID, timedelta(days=30))).removed

    assert run_db(relay.database_url, work) == 1
    digest = _digest(alpha.sync().digest)
    assert digest.matched
    assert (digest.compacted, digest.requeued, digest.device_lacks) == (1, 0, 0)
    assert ids[0] not in contents(alpha)
    assert _digest(alpha.sync().digest).round_trips == 1


def _verify(device: DeviceHandle, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ENGRAM_PASSPHRASE": PASSPHRASE}
    env.pop("ENGRAM_VAULT", None)
    return subprocess.run(
        [EXE, "--vault", str(device.path), "verify", *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def test_verify_exits_non_zero_on_a_mismatch_it_did_not_repair(
    devices: list[DeviceHandle], tmp_path: Path
) -> None:
    alpha, bravo, _ = devices
    ids = [add(alpha, f"memory {i}") for i in range(3)]
    sync_all(alpha, bravo)
    bravo.restart()
    ok = _verify(bravo, "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["matched"] is True
    with bravo.open() as session:
        session.vault.conn.execute("DELETE FROM engrams WHERE id = ?", (ids[1],))
    bravo.restart()
    found = _verify(bravo, "--json")
    assert found.returncode == 1, found.stderr
    body = json.loads(found.stdout)
    assert (body["matched"], body["device_lacks"], body["restored"]) == (False, 1, 0)
    assert ids[1] not in contents(bravo)  # without --repair nothing changes
    bravo.restart()
    repaired = _verify(bravo, "--repair", "--json")
    assert repaired.returncode == 0, repaired.stderr
    assert json.loads(repaired.stdout)["restored"] == 1
    assert ids[1] in contents(bravo)
