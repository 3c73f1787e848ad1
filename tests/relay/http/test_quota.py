"""Quotas (PROTOCOL §5, §6): projection over the accepted set, the exact 402 body, no writes.

size_bytes of a blob = len(its ciphertext base64 text). The module's relay allows
2,000 bytes and 3 devices per vault; each test uses its own vault.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.relay.conftest import Relay
from tests.relay.support import (
    Sealer,
    client,
    module_relay,
    new_device_id,
    new_vault_id,
    pull_all,
    push,
    push_ok,
)

QUOTA_BYTES = 2000
QUOTA_DEVICES = 3


@pytest.fixture(scope="module")
def relay(postgres_url: str) -> Iterator[Relay]:
    with module_relay(postgres_url, quota_bytes=QUOTA_BYTES, quota_devices=QUOTA_DEVICES) as served:
        yield served


def snapshot(relay: Relay, vault_id: str) -> dict[str, Any]:
    """Everything a push could change for this vault."""
    blobs = relay.sql(
        "SELECT memory_id, device_id, vector_clock, size_bytes, seq, deleted FROM blobs"
        " WHERE vault_id = $1 ORDER BY seq",
        vault_id,
    )
    vault = relay.sql("SELECT seq, bytes_used FROM vaults WHERE vault_id = $1", vault_id)
    devices = relay.sql(
        "SELECT device_id, revoked_at IS NOT NULL AS revoked FROM devices WHERE vault_id = $1"
        " ORDER BY device_id",
        vault_id,
    )
    return {
        "blobs": [dict(r) for r in blobs],
        "vault": [dict(r) for r in vault],
        "devices": [dict(r) for r in devices],
    }


def bytes_used(relay: Relay, vault_id: str) -> int:
    """The vault's byte counter, checked against the stored blobs on every read."""
    (row,) = relay.sql(
        "SELECT v.bytes_used, (SELECT coalesce(sum(size_bytes), 0) FROM blobs b"
        " WHERE b.vault_id = v.vault_id) AS actual FROM vaults v WHERE v.vault_id = $1",
        vault_id,
    )
    assert row["bytes_used"] == row["actual"]
    used: int = row["bytes_used"]
    return used


def assert_quota_402(
    relay: Relay,
    http: httpx.Client,
    vault_id: str,
    blobs: list[Any],
    detail: str,
    limit: int,
    used: int,
) -> None:
    before = snapshot(relay, vault_id)
    response = push(http, vault_id, blobs)
    assert response.status_code == 402, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {
        "error": {"code": "quota_exceeded", "detail": detail, "limit": limit, "used": used}
    }
    assert snapshot(relay, vault_id) == before  # nothing written, not even a device row


# --- bytes ---------------------------------------------------------------------------------


def test_bytes_quota_rejects_the_whole_batch(relay: Relay, http: httpx.Client, vault: str) -> None:
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.sized("a", 1, 1200)])
    assert bytes_used(relay, vault) == 1200
    newcomer = Sealer(vault)
    assert_quota_402(
        relay,
        http,
        vault,
        [newcomer.sized("small", 1, 40), newcomer.sized("b", 1, 1200)],
        "bytes",
        QUOTA_BYTES,
        1200 + 40 + 1200,
    )
    assert [b["memory_id"] for b in pull_all(http, vault)[0]] == ["a"]


def test_exactly_at_the_limit_is_allowed(relay: Relay, http: httpx.Client, vault: str) -> None:
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.sized("a", 1, 1000), sealer.sized("b", 1, 1000)])
    assert bytes_used(relay, vault) == QUOTA_BYTES
    assert_quota_402(relay, http, vault, [sealer.sized("c", 1, 40)], "bytes", QUOTA_BYTES, 2040)


def test_overwrites_project_the_difference(relay: Relay, http: httpx.Client, vault: str) -> None:
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.sized("a", 1, 1000), sealer.sized("b", 1, 1000)])
    # At the limit, a smaller version of a memory fits (it frees bytes)...
    assert push_ok(http, vault, [sealer.sized("a", 2, 800)])["accepted"] == 1
    assert bytes_used(relay, vault) == 1800
    # ...and growing it back to exactly the limit is fine...
    assert push_ok(http, vault, [sealer.sized("a", 3, 1000)])["accepted"] == 1
    assert bytes_used(relay, vault) == QUOTA_BYTES
    # ...but one base64 quantum more is not.
    assert_quota_402(relay, http, vault, [sealer.sized("a", 4, 1004)], "bytes", QUOTA_BYTES, 2004)
    # A shrink of one memory pays for a new one in the same batch.
    answer = push_ok(http, vault, [sealer.sized("a", 4, 600), sealer.sized("c", 1, 400)])
    assert answer["accepted"] == 2
    assert bytes_used(relay, vault) == QUOTA_BYTES


def test_tombstones_replacing_live_blobs_free_bytes(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.sized("a", 1, 1000), sealer.sized("b", 1, 1000)])
    tombstone = sealer.blob("a", 2, deleted=True)
    assert push_ok(http, vault, [tombstone])["accepted"] == 1
    assert bytes_used(relay, vault) == 1000 + len(tombstone.ciphertext)
    room = QUOTA_BYTES - bytes_used(relay, vault)
    fits = room // 4 * 4
    assert push_ok(http, vault, [sealer.sized("c", 1, fits)])["accepted"] == 1
    assert_quota_402(
        relay,
        http,
        vault,
        [sealer.sized("d", 1, 40)],
        "bytes",
        QUOTA_BYTES,
        bytes_used(relay, vault) + 40,
    )


def test_rejected_blobs_are_not_projected(relay: Relay, http: httpx.Client, vault: str) -> None:
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.sized("a", 5, 1000), sealer.sized("b", 1, 1000)])
    # A stale (lower clock) huge version is rejected by §6 step 6 before the projection.
    answer = push_ok(http, vault, [sealer.sized("a", 4, 1600)])
    assert (answer["accepted"], answer["rejected"]) == (0, ["a"])
    # Of duplicates in one batch only the accepted (highest clock) one counts.
    answer = push_ok(http, vault, [sealer.sized("b", 3, 1000), sealer.sized("b", 2, 1600)])
    assert (answer["accepted"], answer["rejected"]) == (1, ["b"])
    assert bytes_used(relay, vault) == QUOTA_BYTES


def test_per_vault_override_wins(relay: Relay, http: httpx.Client, vault: str) -> None:
    relay.sql("INSERT INTO quotas (vault_id, max_bytes) VALUES ($1, 3000)", vault)
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.sized("a", 1, 2500)])
    assert_quota_402(relay, http, vault, [sealer.sized("b", 1, 600)], "bytes", 3000, 3100)
    # Lowering the limit below what is stored: shrinking still works, growth does not.
    relay.sql("UPDATE quotas SET max_bytes = 1000 WHERE vault_id = $1", vault)
    assert push_ok(http, vault, [sealer.sized("a", 2, 2000)])["accepted"] == 1
    assert_quota_402(relay, http, vault, [sealer.sized("b", 1, 40)], "bytes", 1000, 2040)


# --- devices -------------------------------------------------------------------------------


def test_devices_quota(relay: Relay, http: httpx.Client, vault: str) -> None:
    devices = [Sealer(vault) for _ in range(QUOTA_DEVICES)]
    for i, device in enumerate(devices):
        push_ok(http, vault, [device.blob(f"m{i}", 1)])
    fourth, fifth = Sealer(vault), Sealer(vault)
    assert_quota_402(relay, http, vault, [fourth.blob("m4", 1)], "devices", QUOTA_DEVICES, 4)
    assert_quota_402(
        relay,
        http,
        vault,
        [devices[0].blob("m0", 2), fourth.blob("m4", 1), fifth.blob("m5", 1)],
        "devices",
        QUOTA_DEVICES,
        5,
    )
    # Known devices keep syncing.
    assert push_ok(http, vault, [devices[0].blob("m0", 2)])["accepted"] == 1
    # Revoking a device frees its slot.
    revoked = devices[2].device_id
    assert http.delete(f"/v1/vaults/{vault}/devices/{revoked}").status_code == 200
    assert push_ok(http, vault, [fourth.blob("m4", 1)])["accepted"] == 1
    assert_quota_402(relay, http, vault, [fifth.blob("m5", 1)], "devices", QUOTA_DEVICES, 4)


def register(http: httpx.Client, vault: str, device_id: str, label: str) -> httpx.Response:
    return http.post(
        f"/v1/vaults/{vault}/devices/register", json={"device_id": device_id, "label": label}
    )


def test_registering_a_device_beyond_the_devices_quota_is_402(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    devices = [Sealer(vault) for _ in range(QUOTA_DEVICES)]
    for i, sealer in enumerate(devices):
        push_ok(http, vault, [sealer.blob(f"m{i}", 1)])
    fourth = Sealer(vault)
    before = snapshot(relay, vault)
    registered = register(http, vault, fourth.device_id, "fourth laptop")
    assert registered.status_code == 402, registered.text
    assert registered.json() == {
        "error": {"code": "quota_exceeded", "detail": "devices", "limit": QUOTA_DEVICES, "used": 4}
    }
    assert snapshot(relay, vault) == before  # no device row for it
    assert_quota_402(relay, http, vault, [fourth.blob("m4", 1)], "devices", QUOTA_DEVICES, 4)
    # Devices that hold a slot keep labelling; a revoked device frees its slot.
    assert register(http, vault, devices[0].device_id, "first").status_code == 200
    http.delete(f"/v1/vaults/{vault}/devices/{devices[1].device_id}")
    assert register(http, vault, devices[1].device_id, "revoked").status_code == 200
    assert register(http, vault, fourth.device_id, "fourth laptop").status_code == 200


def test_labelled_devices_take_quota_slots(relay: Relay, http: httpx.Client, vault: str) -> None:
    # Registrations alone cannot grow the roster past the quota (the issue: unlimited
    # devices from any member key).
    member = relay.mint(vault)
    with client(relay, member) as m:
        for i in range(QUOTA_DEVICES):
            assert register(m, vault, new_device_id(), f"device {i}").status_code == 200
        response = register(m, vault, new_device_id(), "one too many")
    assert response.status_code == 402
    assert response.json()["error"]["used"] == QUOTA_DEVICES + 1


def test_concurrent_registrations_never_pass_the_quota(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    def one(i: int) -> int:
        with client(relay) as c:
            return register(c, vault, new_device_id(), f"racer {i}").status_code

    with ThreadPoolExecutor(max_workers=12) as pool:
        codes = list(pool.map(one, range(12)))
    assert sorted(codes) == [200] * QUOTA_DEVICES + [402] * (12 - QUOTA_DEVICES)
    rows = relay.sql("SELECT count(*) AS n FROM devices WHERE vault_id = $1", vault)
    assert rows[0]["n"] == QUOTA_DEVICES


def test_pulling_with_a_device_header_does_not_bypass_the_devices_quota(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    for i in range(QUOTA_DEVICES):
        push_ok(http, vault, [Sealer(vault).blob(f"m{i}", 1)])
    fourth = Sealer(vault)
    pulled = http.get(
        f"/v1/vaults/{vault}/pull",
        params={"cursor": 0},
        headers={"X-Engram-Device": fourth.device_id},
    )
    assert pulled.status_code == 200
    assert_quota_402(relay, http, vault, [fourth.blob("m4", 1)], "devices", QUOTA_DEVICES, 4)


def test_quota_is_per_vault(relay: Relay, http: httpx.Client) -> None:
    first, second = new_vault_id(), new_vault_id()
    device = new_device_id()
    push_ok(http, first, [Sealer(first).sized("a", 1, 2000, device_id=device)])
    push_ok(http, second, [Sealer(second).sized("a", 1, 2000, device_id=device)])
    assert bytes_used(relay, first) == bytes_used(relay, second) == QUOTA_BYTES
