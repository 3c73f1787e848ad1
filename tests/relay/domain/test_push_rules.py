"""Unit tests of relay/domain/push_rules.py: PROTOCOL §6 steps 1-7 as pure functions."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_sync.relay.domain.domain_errors import (
    BatchTooLargeError,
    EmptyBatchError,
    InvalidBlobError,
)
from engram_sync.relay.domain.push_rules import (
    CheckedBlob,
    StoredVersion,
    _checked_at_once,
    _checked_one_by_one,
    check_blobs,
    check_structure,
    plan_push,
)
from engram_sync.shared_format import SyncBlob
from engram_sync.shared_format.b64 import b64encode_std
from tests.relay.support import Sealer

VAULT = "vault-rules"
MAX = 1_048_576
SEALER = Sealer(VAULT)
DEV = SEALER.device_id
OTHER_DEV = "other-device"


def blob(memory: str = "m", clock: int = 1, **changes: Any) -> SyncBlob:
    return msgspec.structs.replace(SEALER.blob(memory, clock), **changes)


def checked(*blobs: SyncBlob) -> list[CheckedBlob]:
    return check_structure(list(blobs), 1000)


def plan(
    *blobs: SyncBlob,
    bound: str | None = None,
    revoked: set[str] | None = None,
    stored: dict[str, StoredVersion] | None = None,
    max_blob_bytes: int = MAX,
) -> tuple[list[tuple[str, int]], list[str], list[str], dict[str, int]]:
    result = plan_push(
        checked(*blobs),
        vault_id=VAULT,
        bound_device=bound,
        max_blob_bytes=max_blob_bytes,
        revoked=revoked or set(),
        stored=stored or {},
    )
    accepted = [(c.blob.memory_id, c.blob.vector_clock) for c in result.accepted]
    return accepted, result.rejected, result.revoked_devices, dict(result.reasons)


# --- step 1: structure -----------------------------------------------------------------


def structure_error(*blobs: SyncBlob) -> InvalidBlobError:
    """The domain error of step 1 (over HTTP: tests/relay/http/test_refusal_bodies.py)."""
    with pytest.raises(InvalidBlobError) as info:
        checked(*blobs)
    return info.value


def test_empty_and_oversized_batches() -> None:
    with pytest.raises(EmptyBatchError) as empty:
        checked()
    assert empty.value.max_blobs == 1000
    with pytest.raises(BatchTooLargeError) as large:
        check_structure([blob(f"m{i}") for i in range(3)], 2)
    assert (large.value.count, large.value.max_blobs) == (3, 2)
    assert len(check_structure([blob(f"m{i}") for i in range(2)], 2)) == 2


def test_valid_blobs_carry_instant_and_size() -> None:
    one = blob(created_at="2026-08-30T14:00:00.123456789+02:00")
    (item,) = checked(one)
    assert item.position == 0
    assert item.size_bytes == len(one.ciphertext)
    assert item.created_at_ts.isoformat() == "2026-08-30T14:00:00.123456+02:00"


BAD = b64encode_std(b"\x00" * 27)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"ciphertext": "not base64!"}, "ciphertext is not valid base64"),
        ({"ciphertext": "QUJD"}, "fewer than 28"),  # 3 bytes
        ({"ciphertext": BAD}, "27 bytes, fewer than 28"),
        ({"ciphertext": "QUJDRA"}, "ciphertext is not valid base64"),  # no padding
        ({"hmac": b64encode_std(b"\x00" * 31)}, "hmac decodes to 31 bytes"),
        ({"hmac": b64encode_std(b"\x00" * 33)}, "hmac decodes to 33 bytes"),
        ({"hmac": "%%%"}, "hmac is not valid base64"),
        ({"created_at": "yesterday"}, "created_at"),
        ({"created_at": "2026-08-30T12:00:00"}, "created_at"),  # no offset
        ({"created_at": "2026-02-30T12:00:00+00:00"}, "created_at"),
        ({"vault_id": ""}, "vault_id is empty"),
        ({"memory_id": ""}, "memory_id is empty"),
        ({"device_id": ""}, "device_id is empty"),
        ({"memory_id": "m" * 257}, "memory_id is longer than 256"),
        ({"device_id": "d" * 257}, "device_id is longer than 256"),
        ({"vault_id": "v" * 257}, "vault_id is longer than 256"),
        ({"memory_id": "a\x00b"}, "control characters"),
    ],
)
def test_structural_problems_name_the_blob_index(changes: dict[str, Any], reason: str) -> None:
    error = structure_error(blob("ok-0"), blob("ok-1"), blob("bad", **changes))
    assert error.index == 2
    assert reason in error.reason
    assert error.field == next(iter(changes))
    assert str(error).startswith("blob 2: ")


def test_boundaries_that_are_still_valid() -> None:
    exactly_28 = b64encode_std(b"\x01" * 28)
    ids = "i" * 256
    items = checked(blob(ciphertext=exactly_28), blob(memory_id=ids, device_id=ids, vault_id=ids))
    assert len(items) == 2


def test_the_first_bad_blob_is_reported() -> None:
    error = structure_error(blob("a"), blob("b", hmac="AA=="), blob("c", ciphertext="x"))
    assert (error.index, error.field) == (1, "hmac")


# --- steps 2-7 ---------------------------------------------------------------------------


def test_all_good() -> None:
    accepted, rejected, revoked, reasons = plan(blob("a"), blob("b", 5))
    assert accepted == [("a", 1), ("b", 5)]
    assert (rejected, revoked, reasons) == ([], [], {})


def test_step2_oversized_blob_alone_is_rejected() -> None:
    big = blob("big", ciphertext=b64encode_std(b"\x00" * 96))  # 128 characters
    fits = blob("fits", ciphertext=b64encode_std(b"\x00" * 93))  # 124 characters
    small = blob("small")
    assert len(small.ciphertext) < 124
    accepted, rejected, _, reasons = plan(big, fits, small, max_blob_bytes=124)
    assert accepted == [("fits", 1), ("small", 1)]
    assert rejected == ["big"]
    assert reasons == {"too_large": 1}


def test_step2_counts_base64_characters_not_decoded_bytes() -> None:
    limit = 120
    at_limit = blob("at", ciphertext=b64encode_std(b"\x00" * 90))  # exactly 120 characters
    over = blob("over", ciphertext=b64encode_std(b"\x00" * 91))  # 124 characters
    accepted, rejected, _, _ = plan(at_limit, over, max_blob_bytes=limit)
    assert accepted == [("at", 1)]
    assert rejected == ["over"]


def test_step3_wrong_vault() -> None:
    accepted, rejected, _, reasons = plan(blob("a"), blob("b", vault_id="elsewhere"))
    assert accepted == [("a", 1)]
    assert rejected == ["b"]
    assert reasons == {"wrong_vault": 1}


def test_step4_revoked_device_is_listed_once() -> None:
    gone = "gone-device"
    accepted, rejected, revoked, reasons = plan(
        blob("a", device_id=gone), blob("b", device_id=gone), blob("c"), revoked={gone}
    )
    assert accepted == [("c", 1)]
    assert rejected == ["a", "b"]
    assert revoked == [gone]
    assert reasons == {"device_revoked": 2}


def test_step5_bound_key_only_pushes_its_own_device() -> None:
    accepted, rejected, revoked, reasons = plan(
        blob("mine"), blob("theirs", device_id=OTHER_DEV), bound=DEV
    )
    assert accepted == [("mine", 1)]
    assert rejected == ["theirs"]
    assert revoked == []
    assert reasons == {"wrong_device": 1}


def test_step6_equal_and_lower_clocks_are_stale() -> None:
    stored = {"eq": StoredVersion(5, 10), "lo": StoredVersion(5, 10), "hi": StoredVersion(5, 10)}
    accepted, rejected, _, reasons = plan(
        blob("eq", 5), blob("lo", 4), blob("hi", 6), stored=stored
    )
    assert accepted == [("hi", 6)]
    assert rejected == ["eq", "lo"]
    assert reasons == {"stale_clock": 2}


def test_step7_only_the_highest_clock_of_a_batch_wins() -> None:
    accepted, rejected, _, reasons = plan(blob("m", 3), blob("m", 9), blob("m", 4), blob("n", 1))
    assert accepted == [("m", 9), ("n", 1)]
    assert rejected == ["m"]  # listed once, although two versions lost
    assert reasons == {"superseded_in_batch": 2}


def test_step7_first_of_equal_clocks_wins() -> None:
    first, second = blob("m", 2, device_id="d1"), blob("m", 2, device_id="d2")
    result = plan_push(
        checked(first, second),
        vault_id=VAULT,
        bound_device=None,
        max_blob_bytes=MAX,
        revoked=set(),
        stored={},
    )
    assert [c.blob.device_id for c in result.accepted] == ["d1"]
    assert result.rejected == ["m"]


def test_step7_with_a_stored_version() -> None:
    accepted, rejected, _, reasons = plan(
        blob("m", 7), blob("m", 6), blob("m", 5), stored={"m": StoredVersion(5, 1)}
    )
    assert accepted == [("m", 7)]
    assert rejected == ["m"]
    assert reasons == {"superseded_in_batch": 1, "stale_clock": 1}


def test_the_first_failing_check_decides() -> None:
    big = b64encode_std(b"\x00" * 96)
    # oversized AND wrong vault AND revoked AND wrong device AND stale: step 2 decides.
    _, _, revoked, reasons = plan(
        blob("m", 1, ciphertext=big, vault_id="elsewhere", device_id="gone"),
        bound=DEV,
        revoked={"gone"},
        stored={"m": StoredVersion(9, 1)},
        max_blob_bytes=124,
    )
    assert reasons == {"too_large": 1}
    assert revoked == []
    # wrong vault beats revoked: the device is not reported as revoked.
    _, _, revoked, reasons = plan(
        blob("m", vault_id="elsewhere", device_id="gone"), revoked={"gone"}
    )
    assert reasons == {"wrong_vault": 1}
    assert revoked == []
    # revoked beats a wrong device.
    _, _, revoked, reasons = plan(blob("m", device_id="gone"), bound=DEV, revoked={"gone"})
    assert reasons == {"device_revoked": 1}
    assert revoked == ["gone"]
    # wrong device beats stale.
    _, _, _, reasons = plan(
        blob("m", 1, device_id=OTHER_DEV), bound=DEV, stored={"m": StoredVersion(9, 1)}
    )
    assert reasons == {"wrong_device": 1}


def test_rejected_keeps_batch_order() -> None:
    _, rejected, _, _ = plan(
        blob("z", vault_id="x"),
        blob("a", device_id="gone"),
        blob("m", 1),
        revoked={"gone"},
        stored={"m": StoredVersion(1, 1)},
    )
    assert rejected == ["z", "a", "m"]


@pytest.mark.parametrize("field", ["vault_id", "memory_id", "device_id"])
def test_every_blob_s_ids_are_checked_when_the_batch_repeats_them(field: str) -> None:
    """Issue 36: ids found valid once in a request are not checked again (a batch repeats its
    vault and device ids), and a later blob's invalid id is still refused at its index."""
    good = [blob(f"m{i}") for i in range(3)]
    bad = msgspec.structs.replace(good[2], **{field: "bad\x00id"})
    error = structure_error(good[0], good[1], bad)
    assert (error.index, error.field) == (2, field)
    assert "control characters" in error.reason


# --- step 1 at once (issue 36) ---------------------------------------------------------

_HOSTILE_FIELDS = {
    "ciphertext": ["", "QUJD", BAD, "QUJDRA", "QUJDRB==", "QU=JDRA=", "QUJD\u00e9AAA",
                   b64encode_std(b"\x01" * 28), b64encode_std(b"\x01" * 29),
                   b64encode_std(b"\x01" * 30)],
    "hmac": ["", "AA==", "%%%", b64encode_std(b"\x00" * 31), b64encode_std(b"\x00" * 33),
             b64encode_std(b"\x07" * 32)[:-2] + "B=", b64encode_std(b"\x07" * 32)],
    "created_at": ["yesterday", "2026-08-30T12:00:00", "2026-02-30T12:00:00.000000+00:00",
                   "2026-08-30T14:00:00.123456789+02:00", "2026-08-30T14:00:00Z",
                   "0001-01-01T00:00:00.000000+14:00", "0001-01-01T00:00:00.000000-14:00",
                   "9999-12-31T23:59:59.000000-14:00", "9999-12-31T23:59:59.000000+00:00",
                   "2026-08-30t14:00:00.000000+00:00", "2026-08-30T14:00:00.000000+24:00"],
    "vault_id": ["", "v" * 256, "v" * 257, "a\x00b", "é"],
    "memory_id": ["", "m" * 256, "m" * 257, "a\x1fb", "a\x7fb", "m-é"],
    "device_id": ["", "d" * 257, "d\nx"],
}  # fmt: skip


def _each_or_refused(blobs: list[SyncBlob]) -> list[CheckedBlob] | tuple[int, str, str]:
    try:
        return _checked_one_by_one(blobs)
    except InvalidBlobError as exc:
        return (exc.index, exc.field, exc.reason)


@given(
    st.integers(1, 5),
    st.lists(st.tuples(st.integers(0, 4), st.sampled_from(sorted(_HOSTILE_FIELDS)),
                       st.integers(0, 10)), max_size=3),
)  # fmt: skip
def test_a_batch_checked_at_once_is_the_same_as_blob_by_blob(
    size: int, changes: list[tuple[int, str, int]]
) -> None:
    """Issue 36: `check_blobs` checks a batch rule by rule over all its blobs, and goes blob
    by blob only when one rule finds a blob it does not pass. The fast path never passes
    a batch the blob-by-blob check refuses, and where it passes one, it gives the same
    checked blobs; a batch with an invalid blob is refused naming the same blob and field."""
    blobs = [blob(f"m{i}", i + 1) for i in range(size)]
    for at, name, pick in changes:
        values = _HOSTILE_FIELDS[name]
        if at < size:
            blobs[at] = msgspec.structs.replace(blobs[at], **{name: values[pick % len(values)]})
    each = _each_or_refused(blobs)
    at_once = _checked_at_once(blobs)
    if isinstance(each, tuple):
        assert at_once is None
        with pytest.raises(InvalidBlobError) as info:
            check_blobs(blobs)
        assert (info.value.index, info.value.field, info.value.reason) == each
    else:
        assert at_once is None or at_once == each
        assert check_blobs(blobs) == each


def test_a_batch_of_written_blobs_is_checked_at_once() -> None:
    """The common case takes the fast path (else the speed of issue 36 is lost unseen)."""
    blobs = [blob(f"m{i}", i + 1) for i in range(20)]
    assert _checked_at_once(blobs) == _checked_one_by_one(blobs)
    assert _checked_at_once(blobs) is not None
