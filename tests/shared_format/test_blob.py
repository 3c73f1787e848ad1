"""Blob sealing and opening (PROTOCOL §3): golden HMACs, round trips, tampering, malformed input."""

from __future__ import annotations

import base64
import os

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram_sync.shared_format.b64 import b64encode_std
from engram_sync.shared_format.blob import BlobCipher, blob_hmac
from engram_sync.shared_format.errors import BlobDecryptError, BlobMalformedError, BlobTamperedError
from engram_sync.shared_format.sync_keys import SyncKeys
from engram_sync.shared_format.timestamps import parse_rfc3339
from engram_sync.shared_format.wire import SyncBlob

GOLDEN = {
    "vault_id": "engram-local",
    "memory_id": "mem_1a2b3c4d-5e6f-4a",
    "device_id": "4f0c8c1e-1111-4222-8333-944455556666",
    "vector_clock": 17,
    "ciphertext": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
    "created_at": "2026-08-30T12:00:00.123456789+00:00",
}
GOLDEN_LIVE = "DFrJI+iP59qs/V1DhN1l0XyCrhqZZdbMObh14YIMheo="
GOLDEN_DELETED = "2AyaX/vBX3JX0/tfJthG+6VccKZ4FMVzwWW0ECOEu30="


@pytest.fixture(scope="module")
def cipher(golden_keys: SyncKeys) -> BlobCipher:
    return BlobCipher(golden_keys)


@pytest.fixture(scope="module")
def other_cipher() -> BlobCipher:
    return BlobCipher(SyncKeys(enc_key=os.urandom(32), hmac_key=os.urandom(32)))


def _seal(cipher: BlobCipher, text: str = "hello", **overrides: object) -> SyncBlob:
    args: dict[str, object] = {
        "vault_id": "v1",
        "memory_id": "mem_1",
        "device_id": "dev-a",
        "vector_clock": 5,
        "deleted": False,
    }
    args.update(overrides)
    return cipher.seal(text, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("deleted", "expected"), [(False, GOLDEN_LIVE), (True, GOLDEN_DELETED)])
def test_golden_hmac(golden_keys: SyncKeys, deleted: bool, expected: str) -> None:
    mac = blob_hmac(golden_keys.hmac_key, deleted=deleted, **GOLDEN)  # type: ignore[arg-type]
    assert b64encode_std(mac) == expected


@pytest.mark.parametrize(("deleted", "expected"), [(False, GOLDEN_LIVE), (True, GOLDEN_DELETED)])
def test_golden_blob_verifies(cipher: BlobCipher, deleted: bool, expected: str) -> None:
    blob = SyncBlob(hmac=expected, deleted=deleted, **GOLDEN)  # type: ignore[arg-type]
    cipher.verify(blob)  # the golden envelope authenticates ...
    # ... but its fake ciphertext (32 bytes of counting) is not AES-GCM output.
    with pytest.raises(BlobDecryptError):
        cipher.open(blob)
    flipped = msgspec.structs.replace(blob, deleted=not deleted)
    with pytest.raises(BlobTamperedError):
        cipher.verify(flipped)


def test_seal_stamps_created_at_with_plus_zero_offset(cipher: BlobCipher) -> None:
    blob = _seal(cipher)
    assert blob.created_at.endswith("+00:00")
    assert "Z" not in blob.created_at
    parse_rfc3339(blob.created_at)


def test_seal_keeps_given_created_at_verbatim(cipher: BlobCipher) -> None:
    stamp = "2026-08-30T12:00:00.123456789+00:00"
    blob = _seal(cipher, created_at=stamp)
    assert blob.created_at == stamp
    assert cipher.open(blob) == "hello"


def test_ciphertext_layout(cipher: BlobCipher, golden_keys: SyncKeys) -> None:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    blob = _seal(cipher, "payload")
    raw = base64.b64decode(blob.ciphertext, validate=True)
    assert len(raw) == 12 + len(b"payload") + 16
    assert AESGCM(golden_keys.enc_key).decrypt(raw[:12], raw[12:], None) == b"payload"
    assert len(base64.b64decode(blob.hmac)) == 32


def test_nonces_are_fresh(cipher: BlobCipher) -> None:
    a, b = _seal(cipher), _seal(cipher)
    assert a.ciphertext != b.ciphertext
    assert cipher.open(a) == cipher.open(b) == "hello"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=2000), deleted=st.booleans(), clock=st.integers(0, 2**63 - 1))
def test_round_trip_unicode(cipher: BlobCipher, text: str, deleted: bool, clock: int) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        with pytest.raises(BlobMalformedError):
            _seal(cipher, text, deleted=deleted, vector_clock=clock)
        return
    blob = _seal(cipher, text, deleted=deleted, vector_clock=clock)
    assert cipher.open(blob) == text


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.integers(0, 1024 * 1024), char=st.characters(blacklist_categories=["Cs"]))
def test_round_trip_sizes_up_to_one_mib(cipher: BlobCipher, size: int, char: str) -> None:
    text = char * (size // len(char.encode("utf-8")))  # at most `size` UTF-8 bytes
    blob = _seal(cipher, text)
    assert cipher.open(blob) == text


def test_round_trip_exactly_one_mib(cipher: BlobCipher) -> None:
    text = "é" * (512 * 1024)  # 1 MiB of UTF-8
    assert cipher.open(_seal(cipher, text)) == text


HMAC_FIELDS = {
    "vault_id": "v2",
    "memory_id": "mem_2",
    "device_id": "dev-b",
    "vector_clock": 6,
    "created_at": "2026-01-01T00:00:00.000001+00:00",
    "deleted": True,
}


@pytest.mark.parametrize("field", sorted(HMAC_FIELDS))
def test_each_hmac_input_is_covered(cipher: BlobCipher, field: str) -> None:
    blob = _seal(cipher)
    cipher.open(blob)  # positive case: untouched blob opens
    tampered = msgspec.structs.replace(blob, **{field: HMAC_FIELDS[field]})
    with pytest.raises(BlobTamperedError):
        cipher.open(tampered)


def test_ciphertext_text_is_covered(cipher: BlobCipher) -> None:
    blob = _seal(cipher)
    other = _seal(cipher)  # same plaintext, other nonce
    with pytest.raises(BlobTamperedError):
        cipher.open(msgspec.structs.replace(blob, ciphertext=other.ciphertext))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bit=st.integers(0, (12 + 5 + 16) * 8 - 1))
def test_any_ciphertext_bit_flip_is_detected(cipher: BlobCipher, bit: int) -> None:
    blob = _seal(cipher)
    raw = bytearray(base64.b64decode(blob.ciphertext))
    raw[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(BlobTamperedError):
        cipher.open(msgspec.structs.replace(blob, ciphertext=b64encode_std(bytes(raw))))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bit=st.integers(0, 255))
def test_any_hmac_bit_flip_is_detected(cipher: BlobCipher, bit: int) -> None:
    blob = _seal(cipher)
    raw = bytearray(base64.b64decode(blob.hmac))
    raw[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(BlobTamperedError):
        cipher.open(msgspec.structs.replace(blob, hmac=b64encode_std(bytes(raw))))


def test_foreign_keys_are_detected(cipher: BlobCipher, other_cipher: BlobCipher) -> None:
    blob = _seal(other_cipher)
    assert other_cipher.open(blob) == "hello"
    with pytest.raises(BlobTamperedError):
        cipher.open(blob)


# --- malformed input: always a typed error, never a raw library exception ---------------


def _resign(cipher: BlobCipher, keys: SyncKeys, blob: SyncBlob, **changes: object) -> SyncBlob:
    """Apply changes and recompute a valid HMAC, so decoding (not the MAC) is what fails."""
    changed = msgspec.structs.replace(blob, **changes)
    mac = blob_hmac(
        keys.hmac_key,
        vault_id=changed.vault_id,
        memory_id=changed.memory_id,
        device_id=changed.device_id,
        vector_clock=changed.vector_clock,
        ciphertext=changed.ciphertext,
        deleted=changed.deleted,
        created_at=changed.created_at,
    )
    return msgspec.structs.replace(changed, hmac=b64encode_std(mac))


@pytest.mark.parametrize(
    "ciphertext",
    [
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8",  # missing padding
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8==",  # wrong padding
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxw",  # truncated
        "AAEC AwQF",  # whitespace
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh-_",  # url alphabet
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGA==",  # 26 bytes: shorter than nonce+tag
        "",  # empty
    ],
)
def test_malformed_ciphertext(cipher: BlobCipher, golden_keys: SyncKeys, ciphertext: str) -> None:
    blob = _resign(cipher, golden_keys, _seal(cipher), ciphertext=ciphertext)
    with pytest.raises(BlobMalformedError):
        cipher.open(blob)


def test_non_ascii_ciphertext_is_malformed(cipher: BlobCipher, golden_keys: SyncKeys) -> None:
    with pytest.raises(BlobMalformedError):
        _resign(cipher, golden_keys, _seal(cipher), ciphertext="AAEC\u00e9AwQ=")


def test_non_utf8_plaintext(cipher: BlobCipher, golden_keys: SyncKeys) -> None:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(12)
    raw = nonce + AESGCM(golden_keys.enc_key).encrypt(nonce, b"\xff\xfe\x80", None)
    blob = _resign(cipher, golden_keys, _seal(cipher), ciphertext=b64encode_std(raw))
    with pytest.raises(BlobMalformedError, match="UTF-8"):
        cipher.open(blob)


@pytest.mark.parametrize(
    "hmac_text",
    ["", "not base64!", "AAAA", "DFrJI+iP59qs/V1DhN1l0XyCrhqZZdbMObh14YIMheo", "=" * 44],
)
def test_malformed_hmac_is_rejected(cipher: BlobCipher, hmac_text: str) -> None:
    with pytest.raises(BlobTamperedError):
        cipher.open(msgspec.structs.replace(_seal(cipher), hmac=hmac_text))


def test_lone_surrogates_are_malformed(cipher: BlobCipher) -> None:
    blob = _seal(cipher)
    with pytest.raises(BlobMalformedError):
        cipher.open(msgspec.structs.replace(blob, memory_id="\ud800"))


def test_clock_outside_u64_is_malformed(golden_keys: SyncKeys) -> None:
    args = dict(GOLDEN, vector_clock=2**64)
    with pytest.raises(BlobMalformedError):
        blob_hmac(golden_keys.hmac_key, deleted=False, **args)  # type: ignore[arg-type]
    args["vector_clock"] = 2**64 - 1
    assert len(blob_hmac(golden_keys.hmac_key, deleted=False, **args)) == 32  # type: ignore[arg-type]
