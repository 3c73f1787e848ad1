"""Push semantics of PROTOCOL §6 over real HTTP, with blobs sealed by real keys."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest

from engram_sync.relay.services.config import DEFAULT_MAX_BLOB_BYTES
from engram_sync.shared_format import SyncBlob
from engram_sync.shared_format.b64 import b64encode_std
from tests.relay.conftest import Relay
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    generation,
    module_relay_fixture,
    new_device_id,
    new_vault_id,
    pull_all,
    pull_ok,
    push,
    push_ok,
    versions,
    wire,
)

#: The same tests on the Citus cluster too, by default (issue 18, tests/conftest.py).
pytestmark = pytest.mark.both_databases

FIELDS = (
    "vault_id",
    "memory_id",
    "device_id",
    "vector_clock",
    "ciphertext",
    "hmac",
    "created_at",
    "deleted",
)


relay = module_relay_fixture()


def stored(relay: Relay, vault_id: str) -> list[tuple[str, int]]:
    """(memory_id, vector_clock) of what the database holds for the vault, by seq."""
    rows = relay.sql(
        "SELECT memory_id, vector_clock FROM blobs WHERE vault_id = $1 ORDER BY seq", vault_id
    )
    return [(r["memory_id"], r["vector_clock"]) for r in rows]


def assert_nothing_written(relay: Relay, http: httpx.Client, vault_id: str) -> None:
    assert stored(relay, vault_id) == []
    assert relay.sql("SELECT 1 FROM vaults WHERE vault_id = $1", vault_id) == []
    assert relay.sql("SELECT 1 FROM devices WHERE vault_id = $1", vault_id) == []
    page = pull_ok(http, vault_id, cursor=0)
    assert page == {
        "blobs": [],
        "has_more": False,
        "cursor": 0,
        "generation": generation(http),
        "head": 0,
    }


# --- what is stored comes back byte-identical ----------------------------------------------


def test_pushed_blobs_come_back_byte_identical(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    sealer = Sealer(vault)
    pushed = [
        sealer.blob("mem-nanos", 17, created_at="2026-08-30T12:00:00.123456789+00:00"),
        sealer.blob("mem-offset", 3, created_at="2026-08-30T17:30:00.5+05:30"),
        sealer.blob("mem-tomb", 9, deleted=True, created_at="2026-08-30T12:00:01+00:00"),
        sealer.blob("mém-ünïcødé-🙂", 2**63 - 1),
        sealer.blob("m" * 256, 0, device_id="d" * 256),
        sealer.blob("mem-text", 1, text="x" * 5000),
    ]
    answer = push_ok(http, vault, pushed)
    assert answer == {
        "accepted": 6,
        "rejected": [],
        "revoked_devices": [],
        "cursor": 6,
        "generation": generation(http),
    }
    by_cursor, cursor = pull_all(http, vault)
    assert cursor == 6
    # Cursor mode adds each blob's seq (PROTOCOL §9, additive); legacy mode sends the
    # eight fields of §3 only.
    assert [b.keys() - FIELDS for b in by_cursor] == [{"seq"}] * 6
    assert [b["seq"] for b in by_cursor] == [1, 2, 3, 4, 5, 6]
    legacy = pull_ok(http, vault)["blobs"]
    assert [set(b) for b in legacy] == [set(FIELDS)] * 6
    order = [b["memory_id"] for b in by_cursor]
    for pulled in (by_cursor, sorted(legacy, key=lambda b: order.index(b["memory_id"]))):
        assert [{k: b[k] for k in FIELDS} for b in pulled] == [wire(b) for b in pushed]
    # The envelope still verifies and decrypts with the real keys after the round trip.
    for blob in by_cursor:
        opened = sealer.cipher.open(msgspec.convert({k: blob[k] for k in FIELDS}, SyncBlob))
        assert blob["memory_id"] in opened or blob["memory_id"] == "mem-text"
    # And the database holds the created_at text exactly as sent (it is inside the HMAC).
    rows = relay.sql(
        "SELECT created_at, size_bytes, ciphertext FROM blobs WHERE vault_id = $1"
        " AND memory_id = 'mem-nanos'",
        vault,
    )
    assert rows[0]["created_at"] == "2026-08-30T12:00:00.123456789+00:00"
    assert rows[0]["size_bytes"] == len(pushed[0].ciphertext) == len(rows[0]["ciphertext"])


def test_push_answer_reports_the_vault_cursor(http: httpx.Client, vault: str) -> None:
    sealer = Sealer(vault)
    assert push_ok(http, vault, sealer.blobs(3))["cursor"] == 3
    assert push_ok(http, vault, [sealer.blob("mem-0000", 2)])["cursor"] == 4
    everything_stale = push_ok(http, vault, [sealer.blob("mem-0001", 1)])
    assert everything_stale == {
        "accepted": 0,
        "rejected": ["mem-0001"],
        "revoked_devices": [],
        "cursor": 4,
        "generation": generation(http),
    }


# --- step 1: structure (the whole request is 400, nothing is written) -----------------------


def _bad(field: str, value: Any) -> dict[str, Any]:
    return {field: value}


STRUCTURAL = {
    "bad_base64": (_bad("ciphertext", "this is not base64!"), "ciphertext is not valid base64"),
    "unpadded_base64": (_bad("ciphertext", "QUJDRA"), "ciphertext is not valid base64"),
    "short_ciphertext": (_bad("ciphertext", b64encode_std(b"\x00" * 27)), "fewer than 28"),
    "hmac_31_bytes": (_bad("hmac", b64encode_std(b"\x00" * 31)), "hmac decodes to 31 bytes"),
    "hmac_33_bytes": (_bad("hmac", b64encode_std(b"\x00" * 33)), "hmac decodes to 33 bytes"),
    "hmac_bad_base64": (_bad("hmac", "*" * 44), "hmac is not valid base64"),
    "created_at_text": (_bad("created_at", "last tuesday"), "created_at"),
    "created_at_no_offset": (_bad("created_at", "2026-08-30T12:00:00"), "created_at"),
    "created_at_bad_day": (_bad("created_at", "2026-13-01T12:00:00+00:00"), "created_at"),
    "empty_memory_id": (_bad("memory_id", ""), "memory_id is empty"),
    "long_memory_id": (_bad("memory_id", "m" * 257), "memory_id is longer than 256"),
    "empty_device_id": (_bad("device_id", ""), "device_id is empty"),
    "long_device_id": (_bad("device_id", "d" * 257), "device_id is longer than 256"),
    "empty_vault_id": (_bad("vault_id", ""), "vault_id is empty"),
    "long_vault_id": (_bad("vault_id", "v" * 257), "vault_id is longer than 256"),
}


@pytest.mark.parametrize("case", list(STRUCTURAL))
def test_structurally_invalid_blob_fails_the_whole_request(
    relay: Relay, http: httpx.Client, vault: str, case: str
) -> None:
    changes, reason = STRUCTURAL[case]
    sealer = Sealer(vault)
    good = sealer.blobs(2)
    bad = {**wire(sealer.blob("bad", 1)), **changes}
    body = assert_error(push(http, vault, [*good, bad, sealer.blob("after", 1)]), 400)
    assert body["code"] == "invalid_blob"
    assert body["index"] == 2
    assert reason in body["reason"]
    assert "nothing was written" in body["error"]
    assert_nothing_written(relay, http, vault)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("vector_clock", 2**63, "<= 9223372036854775807"),
        ("vector_clock", 2**64, "9223372036854775807"),
        ("vector_clock", -1, ">= 0"),
        ("vector_clock", 1.5, "int"),
        ("vector_clock", "7", "int"),  # never coerced: §5 "a field of the wrong type"
        ("vector_clock", "1e3", "int"),
        ("deleted", "false", "bool"),
        ("deleted", 1, "bool"),
        ("deleted", None, "bool"),
        ("ciphertext", 12, "str"),
        ("created_at", None, "str"),
    ],
)
def test_wrong_types_and_out_of_range_clocks_name_the_field(
    relay: Relay, http: httpx.Client, vault: str, field: str, value: Any, expected: str
) -> None:
    sealer = Sealer(vault)
    bad = {**wire(sealer.blob("bad", 1)), field: value}
    body = assert_error(push(http, vault, [sealer.blob("good", 1), bad]), 400)
    assert body["field"] == f"blobs[1].{field}", body
    assert field in body["error"]
    assert expected in body["error"]
    assert_nothing_written(relay, http, vault)


@pytest.mark.parametrize("field", FIELDS)
def test_a_missing_field_is_named(relay: Relay, http: httpx.Client, vault: str, field: str) -> None:
    blob = wire(Sealer(vault).blob("m", 1))
    del blob[field]
    body = assert_error(push(http, vault, [blob]), 400, "invalid_request")
    assert body["field"] == f"blobs[0].{field}"
    assert_nothing_written(relay, http, vault)


def test_batch_size_is_1_to_1000(relay: Relay, http: httpx.Client, vault: str) -> None:
    sealer = Sealer(vault)
    assert_error(push(http, vault, []), 400, "empty_batch")
    assert_error(http.post(f"/v1/vaults/{vault}/push", json={}), 400, "invalid_request")
    blobs = sealer.blobs(1001)
    body = assert_error(push(http, vault, blobs), 400, "batch_too_large")
    assert "1000" in body["error"]
    assert_nothing_written(relay, http, vault)
    assert push_ok(http, vault, blobs[:1000])["accepted"] == 1000


def test_long_vault_id_in_the_path_is_400(http: httpx.Client) -> None:
    vault = "v" * 257
    blob = Sealer(vault).blob("m", 1)
    body = assert_error(push(http, vault, [blob]), 400, "invalid_request")
    assert body["field"] == "vault_id"


# --- step 2: an oversized ciphertext is rejected alone ---------------------------------------


def test_oversized_ciphertext_is_rejected_alone(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    sealer = Sealer(vault)
    limit = DEFAULT_MAX_BLOB_BYTES
    assert http.get("/v1/info").json()["max_blob_bytes"] == limit
    at_limit = sealer.sized("at-limit", 1, limit)
    too_big = sealer.sized("too-big", 1, limit + 4)
    batch = [sealer.blob("before", 1), too_big, at_limit, sealer.blob("after", 1)]
    answer = push_ok(http, vault, batch)
    assert answer["accepted"] == 3
    assert answer["rejected"] == ["too-big"]
    assert answer["revoked_devices"] == []
    assert sorted(stored(relay, vault)) == [("after", 1), ("at-limit", 1), ("before", 1)]
    pulled, _ = pull_all(http, vault)
    assert {b["memory_id"]: b["ciphertext"] for b in pulled}["at-limit"] == at_limit.ciphertext


# --- steps 3-7 --------------------------------------------------------------------------------


def test_blob_for_another_vault_is_rejected(relay: Relay, http: httpx.Client, vault: str) -> None:
    sealer = Sealer(vault)
    other = new_vault_id()
    foreign = sealer.blob("foreign", 1, vault_id=other)
    answer = push_ok(http, vault, [sealer.blob("mine", 1), foreign])
    assert (answer["accepted"], answer["rejected"]) == (1, ["foreign"])
    assert stored(relay, vault) == [("mine", 1)]
    assert stored(relay, other) == []


def test_revoked_device_is_rejected_and_reported(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    sealer = Sealer(vault)
    gone = new_device_id()
    push_ok(http, vault, [sealer.blob("old", 1, device_id=gone)])
    assert http.delete(f"/v1/vaults/{vault}/devices/{gone}").json()["revoked"] is True
    answer = push_ok(
        http,
        vault,
        [
            sealer.blob("new-1", 1, device_id=gone),
            sealer.blob("alive", 1),
            sealer.blob("old", 2, device_id=gone),
        ],
    )
    assert answer["accepted"] == 1
    assert answer["rejected"] == ["new-1", "old"]
    assert answer["revoked_devices"] == [gone]
    assert sorted(stored(relay, vault)) == [("alive", 1), ("old", 1)]


def test_device_bound_key_cannot_push_for_another_device(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    sealer = Sealer(vault)
    with client(relay, relay.mint(vault, device_id=sealer.device_id)) as bound:
        answer = push_ok(
            bound, vault, [sealer.blob("a", 1, device_id=new_device_id()), sealer.blob("b", 1)]
        )
    assert (answer["accepted"], answer["rejected"], answer["revoked_devices"]) == (1, ["a"], [])
    assert stored(relay, vault) == [("b", 1)]


def test_equal_clock_is_stale_and_the_first_writer_wins(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    laptop, phone = Sealer(vault), Sealer(vault)
    assert push_ok(http, vault, [laptop.blob("m", 5)])["accepted"] == 1
    equal = push_ok(http, vault, [phone.blob("m", 5)])
    assert (equal["accepted"], equal["rejected"]) == (0, ["m"])
    lower = push_ok(http, vault, [phone.blob("m", 4)])
    assert (lower["accepted"], lower["rejected"]) == (0, ["m"])
    (kept,) = pull_all(http, vault)[0]
    assert (kept["device_id"], kept["vector_clock"]) == (laptop.device_id, 5)
    higher = push_ok(http, vault, [phone.blob("m", 6)])
    assert (higher["accepted"], higher["rejected"]) == (1, [])
    (kept,) = pull_all(http, vault)[0]
    assert (kept["device_id"], kept["vector_clock"]) == (phone.device_id, 6)


def test_duplicates_in_one_batch_keep_only_the_highest_clock(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    sealer = Sealer(vault)
    batch = [sealer.blob("m", 3), sealer.blob("m", 9), sealer.blob("n", 1), sealer.blob("m", 4)]
    answer = push_ok(http, vault, batch)
    assert answer["accepted"] == 2
    assert answer["rejected"] == ["m"]
    assert sorted(stored(relay, vault)) == [("m", 9), ("n", 1)]
    (pulled_m,) = [b for b in pull_all(http, vault)[0] if b["memory_id"] == "m"]
    (m_seq,) = relay.sql("SELECT seq FROM blobs WHERE vault_id = $1 AND memory_id = 'm'", vault)
    assert pulled_m == {**wire(batch[1]), "seq": m_seq["seq"]}
    # With a stored version: the lower duplicates are stale or superseded, the highest wins.
    again = push_ok(http, vault, [sealer.blob("m", 8), sealer.blob("m", 11), sealer.blob("m", 10)])
    assert (again["accepted"], again["rejected"]) == (1, ["m"])
    assert ("m", 11) in stored(relay, vault)


def test_tombstone_replaces_the_live_blob(relay: Relay, http: httpx.Client, vault: str) -> None:
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.blob("m", 1), sealer.blob("n", 1)])
    push_ok(http, vault, [sealer.blob("m", 2, deleted=True)])
    pulled, cursor = pull_all(http, vault)
    assert versions(pulled) == [("n", 1), ("m", 2)]
    assert [b["deleted"] for b in pulled] == [False, True]
    assert cursor == 3
    assert http.get(f"/v1/vaults/{vault}/stats").json()["total_blobs"] == 1
    # A later live version of the same memory replaces the tombstone (resurrection by clock).
    push_ok(http, vault, [sealer.blob("m", 3)])
    assert http.get(f"/v1/vaults/{vault}/stats").json()["total_blobs"] == 2
