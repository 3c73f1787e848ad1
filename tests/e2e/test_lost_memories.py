"""Two ways memories were lost (issue 35, part 2), through `engram-sync` processes against an
`engram-relay serve` process, each next to its honest case.

1. A member device that syncs before it holds the vault key K (PROTOCOL §8: a blob this
   device cannot open yet never moves its cursor past it): it stops, in one line, moves
   nothing, and once the handoff brought K the next `sync` applies every memory. A device
   that skipped them before this fix (its cursor past them, each recorded as skipped under
   its old keys) gets them too: anti-entropy fetches a version refused under other keys.
2. A mistyped passphrase: a device whose keys open none of the vault's blobs refuses to
   sync into it, in one line, and pushes nothing; an honest device syncs as usual.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_sync.client._cli.main import _watch_retries
from engram_sync.client._vault.vault_key_store import KeysDoNotOpenVaultError, keys_refused_message
from tests.e2e.test_account_cli import FINGERPRINT, Device, ServedRelay, serve_relay
from tests.relay.conftest import ADMIN_KEY

VAULT_ID = "team-notes"
PASSPHRASE = "team notes passphrase kestrel 7c1d"
TYPO = "team notes passphrase kestral 7c1d"  # one letter off
MEMBER_PASSPHRASE = "the member's own local passphrase 2b9e"
MEMORIES = [f"team memory number {n}: the {n}th note" for n in range(8)]


@pytest.fixture
def relay_process(tmp_path: Path, fresh_database_url: str) -> Iterator[ServedRelay]:
    with serve_relay(tmp_path, fresh_database_url) as served:
        yield served


def admin_with_eight(tmp_path: Path, url: str) -> Device:
    admin = Device(tmp_path / "admin", PASSPHRASE)
    admin.run("init")
    admin.run("link", "--relay", url, "--api-key", ADMIN_KEY, "--vault-id", VAULT_ID)
    for text in MEMORIES:
        admin.run("add", text)
    assert "pushed 8" in admin.run("sync").stdout
    return admin


def relay_blobs(served: ServedRelay) -> int:
    [row] = served.relay.sql("SELECT count(*) AS n FROM blobs WHERE vault_id = $1", VAULT_ID)
    return int(row["n"])


def held(device: Device) -> set[str]:
    return {item["content"] for item in json.loads(device.run("list", "--json").stdout)}


def state(device: Device) -> dict[str, object]:
    value: dict[str, object] = json.loads((device.path / "sync_state.json").read_text())
    return value


def hand_off(admin: Device, member: Device) -> None:
    """The member-request handoff (PROTOCOL §14), fingerprints compared by script."""
    asked = member.run("team", "request", "--wait", "0", ok=False)
    assert asked.returncode == 1, asked.stdout + asked.stderr
    [pending] = json.loads(admin.run("team", "pending", "--json").stdout)
    approve = subprocess.run(
        admin.args("team", "approve", pending["request_id"]),
        env=admin.env,
        input="y\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert approve.returncode == 0, approve.stdout + approve.stderr
    admin_fp = FINGERPRINT.findall(approve.stdout)[-1]
    assert "now holds the key" in member.run("team", "request", "--expect", admin_fp).stdout


def refused_in_one_line(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for word in words:
        assert word in lines[0], lines[0]
    assert "Traceback" not in result.stderr


def member(tmp_path: Path, served: ServedRelay) -> Device:
    """A device linked with a member key (not admin), before the handoff."""
    key = served.relay.mint(VAULT_ID)
    device = Device(tmp_path / "member", MEMBER_PASSPHRASE)
    device.run("init")
    linked = device.run(
        "link", "--relay", served.relay.url, "--api-key", key, "--vault-id", VAULT_ID
    )
    assert "`sync` will refuse until then" in linked.stderr  # a note: it links, exit 0
    return device


def test_a_member_that_syncs_before_the_handoff_gets_every_memory_after_it(
    tmp_path: Path, relay_process: ServedRelay
) -> None:
    admin = admin_with_eight(tmp_path, relay_process.relay.url)
    device = member(tmp_path, relay_process)

    early = device.run("sync", ok=False)
    refused_in_one_line(
        early, f"vault {VAULT_ID}'s memories", "engram-sync team request", "nothing was pulled"
    )
    assert held(device) == set()
    assert state(device)["cursor"] == 0  # not moved past what it cannot open
    assert state(device)["skipped"] == []
    assert relay_blobs(relay_process) == 8

    hand_off(admin, device)
    assert "pulled 8 (applied 8)" in device.run("sync").stdout
    assert held(device) == set(MEMORIES)
    assert "in agreement" in device.run("verify").stdout
    # the honest case: the admin's own device, holding K all along, agrees too
    assert "in agreement" in admin.run("verify").stdout


def test_versions_skipped_under_other_keys_are_fetched_once_the_key_arrives(
    tmp_path: Path, relay_process: ServedRelay
) -> None:
    """A member device that synced before this fix: its cursor moved past the 8 blobs and
    each was recorded as skipped (no `keys` in the record). After the handoff `sync` pulls
    nothing new, and anti-entropy (the sync's, and `verify --repair`) must fetch them."""
    admin = admin_with_eight(tmp_path, relay_process.relay.url)
    device = member(tmp_path, relay_process)
    device.run("sync", ok=False)
    rows = relay_process.relay.sql(
        "SELECT memory_id, device_id, vector_clock, seq FROM blobs WHERE vault_id = $1", VAULT_ID
    )
    old = state(device)
    old["cursor"] = max(int(r["seq"]) for r in rows)
    old["skipped"] = [
        {
            "memory_id": r["memory_id"],
            "device_id": r["device_id"],
            "vector_clock": r["vector_clock"],
            "reason": "BlobTamperedError: HMAC mismatch: modified or foreign blob",
            "seen_at": "2026-12-01T10:00:00+00:00",
        }
        for r in rows
    ]
    (device.path / "sync_state.json").write_text(json.dumps(old))

    hand_off(admin, device)
    synced = device.run("sync").stdout
    assert "applied 8" in synced, synced
    assert held(device) == set(MEMORIES)
    assert state(device)["skipped"] == []  # they verified after all
    assert "in agreement" in device.run("verify").stdout
    repaired = device.run("verify", "--repair")
    assert "unresolved" not in repaired.stderr


def test_a_mistyped_passphrase_is_refused_and_pushes_nothing(
    tmp_path: Path, relay_process: ServedRelay
) -> None:
    url = relay_process.relay.url
    admin_with_eight(tmp_path, url)

    typo = Device(tmp_path / "typo", TYPO)
    typo.run("init")
    linked = typo.run("link", "--relay", url, "--api-key", ADMIN_KEY, "--vault-id", VAULT_ID)
    assert linked.stderr.strip().startswith(
        f"note: this passphrase does not open vault {VAULT_ID}'s memories: a typo?"
    ), linked.stderr
    typo.run("add", "written under the mistyped passphrase")
    refused = typo.run("sync", ok=False)
    refused_in_one_line(
        refused,
        f"this passphrase does not open vault {VAULT_ID}'s memories: a typo?",
        "nothing was pulled or pushed",
    )
    assert relay_blobs(relay_process) == 8
    assert state(typo)["cursor"] == 0
    again = typo.run("sync", ok=False)  # still refused: nothing pushed on a second try
    refused_in_one_line(again, "a typo?")
    assert relay_blobs(relay_process) == 8

    honest = Device(tmp_path / "honest", PASSPHRASE)
    honest.run("init")
    linked = honest.run("link", "--relay", url, "--api-key", ADMIN_KEY, "--vault-id", VAULT_ID)
    assert "does not open" not in linked.stderr
    honest.run("add", "written under the right passphrase")
    synced = honest.run("sync").stdout
    assert "pulled 8 (applied 8), pushed 1" in synced, synced
    assert "invalid" not in synced
    assert held(honest) == {*MEMORIES, "written under the right passphrase"}
    assert relay_blobs(relay_process) == 9


def test_watch_stops_at_once_on_keys_that_open_nothing() -> None:
    """`watch` ends with the one line instead of retrying: the same keys fail again."""
    assert not _watch_retries(KeysDoNotOpenVaultError(keys_refused_message(VAULT_ID, "passphrase")))
