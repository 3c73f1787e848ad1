"""Wire types (PROTOCOL §3, §5, §9): field names, defaults, unknown fields, typed errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_sync.shared_format.errors import WireDecodeError
from engram_sync.shared_format.wire import (
    MAX_VECTOR_CLOCK,
    PullRequest,
    PullResponse,
    PushRequest,
    PushResponse,
    QuotaErrorBody,
    QuotaErrorDetail,
    SyncBlob,
    SyncHealth,
    VaultRetirement,
    convert,
    decode_json,
    encode_json,
)

BLOB = {
    "vault_id": "v",
    "memory_id": "m",
    "device_id": "d",
    "vector_clock": 3,
    "ciphertext": "AAAA",
    "hmac": "BBBB",
    "created_at": "2026-01-01T00:00:00+00:00",
    "deleted": False,
}


def _push(**blob_changes: object) -> bytes:
    return json.dumps({"blobs": [dict(BLOB, **blob_changes)]}).encode()


def test_sync_blob_field_names_round_trip() -> None:
    blob = decode_json(json.dumps(BLOB), SyncBlob)
    assert json.loads(encode_json(blob)) == BLOB


def test_unknown_fields_are_ignored() -> None:
    data = json.dumps({**BLOB, "future": {"x": 1}})
    assert decode_json(data, SyncBlob) == decode_json(json.dumps(BLOB), SyncBlob)
    resp = decode_json(b'{"accepted":1,"rejected":[],"new_field":true}', PushResponse)
    assert resp.accepted == 1


def test_additive_fields_decode_and_are_not_emitted_unset() -> None:
    """A pulled blob's `seq` (§9), a pull's `head` and every answer's `generation` (§17)."""
    blob = decode_json(json.dumps({**BLOB, "seq": 9}), SyncBlob)
    assert blob.seq == 9
    assert json.loads(encode_json(blob)) == {**BLOB, "seq": 9}
    assert "seq" not in json.loads(encode_json(decode_json(json.dumps(BLOB), SyncBlob)))
    page = decode_json(b'{"blobs":[],"has_more":false,"generation":"g","head":3}', PullResponse)
    assert (page.generation, page.head) == ("g", 3)
    assert json.loads(encode_json(PullResponse(blobs=[], has_more=False))) == {
        "blobs": [],
        "has_more": False,
    }
    assert decode_json(b'{"accepted":0,"generation":"g"}', PushResponse).generation == "g"
    assert "generation" not in json.loads(encode_json(PushResponse(accepted=0)))


def test_deleted_is_required() -> None:
    data = {k: v for k, v in BLOB.items() if k != "deleted"}
    with pytest.raises(WireDecodeError) as info:
        decode_json(json.dumps({"blobs": [data]}), PushRequest)
    assert info.value.field == "$.blobs[0].deleted"
    assert "deleted" in str(info.value)


def test_revoked_devices_defaults_to_empty() -> None:
    resp = decode_json(b'{"accepted":2,"rejected":["a"]}', PushResponse)
    assert resp.revoked_devices == []
    assert resp.rejected == ["a"]


def test_cursor_is_omitted_unless_set() -> None:
    assert json.loads(encode_json(PushResponse(accepted=0))) == {
        "accepted": 0,
        "rejected": [],
        "revoked_devices": [],
    }
    assert json.loads(encode_json(PushResponse(accepted=0, cursor=7)))["cursor"] == 7
    pull = json.loads(encode_json(PullResponse(blobs=[], has_more=False)))
    assert pull == {"blobs": [], "has_more": False}
    assert decode_json(b'{"blobs":[],"has_more":true,"cursor":12}', PullResponse).cursor == 12


def test_pull_request_defaults_and_cap() -> None:
    req = convert({}, PullRequest)
    assert (req.since, req.limit, req.cursor) == (None, 1000, None)
    assert convert({"limit": "5000"}, PullRequest).limit == 5000  # the relay caps it
    assert convert({"limit": "0", "cursor": "4"}, PullRequest) == PullRequest(limit=0, cursor=4)
    with pytest.raises(WireDecodeError) as info:
        convert({"limit": "-1"}, PullRequest)
    assert info.value.field == "$.limit"
    with pytest.raises(WireDecodeError) as info:
        convert({"cursor": "abc"}, PullRequest)
    assert info.value.field == "$.cursor"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"vector_clock": "3"}, "$.blobs[0].vector_clock"),
        ({"vector_clock": -1}, "$.blobs[0].vector_clock"),
        ({"vector_clock": 2**63}, "$.blobs[0].vector_clock"),
        ({"vector_clock": 2**64 + 5}, "$.blobs[0].vector_clock"),
        ({"vector_clock": 1.5}, "$.blobs[0].vector_clock"),
        ({"deleted": "false"}, "$.blobs[0].deleted"),
        ({"deleted": 0}, "$.blobs[0].deleted"),
        ({"ciphertext": None}, "$.blobs[0].ciphertext"),
        ({"memory_id": 12}, "$.blobs[0].memory_id"),
        ({"hmac": ["x"]}, "$.blobs[0].hmac"),
    ],
)
def test_wrong_types_name_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(WireDecodeError) as info:
        decode_json(_push(**change), PushRequest)
    assert info.value.field == field
    assert field in str(info.value)


def test_max_clock_is_accepted() -> None:
    req = decode_json(_push(vector_clock=MAX_VECTOR_CLOCK), PushRequest)
    assert req.blobs[0].vector_clock == 2**63 - 1


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b"[]", b"null", b'{"blobs":', b"\xff\xfe\x00", b'{"blobs":[1]}', b'"x"'],
)
def test_malformed_documents_are_typed_errors(data: bytes) -> None:
    with pytest.raises(WireDecodeError):
        decode_json(data, PushRequest)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_raw_errors(data: bytes) -> None:
    try:
        result = decode_json(data, PushRequest)
    except WireDecodeError as exc:
        assert str(exc).startswith(("malformed JSON", "invalid PushRequest"))
    else:
        assert isinstance(result, PushRequest)


def test_quota_body_exact_shape() -> None:
    body = QuotaErrorBody(
        error=QuotaErrorDetail(code="quota_exceeded", detail="bytes", limit=10, used=12)
    )
    assert json.loads(encode_json(body)) == {
        "error": {"code": "quota_exceeded", "detail": "bytes", "limit": 10, "used": 12}
    }


def test_health_field_names() -> None:
    health = SyncHealth(
        status="ok", version="0.1.0", uptime_secs=1, vaults=2, total_blobs=3, db_size_bytes=4
    )
    assert set(json.loads(encode_json(health))) == {
        "status",
        "version",
        "uptime_secs",
        "vaults",
        "total_blobs",
        "db_size_bytes",
    }


def test_deep_nesting_is_a_typed_error_not_a_crash() -> None:
    deep = b'{"blobs":[' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"]}"
    with pytest.raises(WireDecodeError, match="nested too deeply"):
        decode_json(deep, PushRequest)
    shallow = b'{"blobs":[' + b'{"a":' * 5 + b"1" + b"}" * 5 + b"]}"
    with pytest.raises(WireDecodeError, match=r"\$\.blobs\[0\]"):  # ordinary error, not depth
        decode_json(shallow, PushRequest)


def test_pull_retired_is_absent_unless_the_vault_is_retired() -> None:
    """PROTOCOL §19: `retired` is additive; a live vault's answer is the §5 core."""
    assert "retired" not in json.loads(encode_json(PullResponse(blobs=[], has_more=False)))
    retired = PullResponse(
        blobs=[], has_more=False, retired=VaultRetirement(None, "2027-01-01T00:00:00+00:00")
    )
    assert json.loads(encode_json(retired))["retired"] == {
        "successor": None,
        "erase_after": "2027-01-01T00:00:00+00:00",
    }
    page = decode_json(
        b'{"blobs":[],"has_more":false,"retired":{"successor":"v2","erase_after":"x"}}',
        PullResponse,
    )
    assert page.retired == VaultRetirement("v2", "x")
