"""Length padding (PROTOCOL §16): PADMÉ lengths, padded plaintexts, readers of both.

The golden lengths below were worked out by hand from the formula (E = floor(log2 L),
S = floor(log2 E) + 1, round L up to a multiple of 2^(E-S)), not printed by the code:
they are frozen, like the known-answer values of PROTOCOL §2 and §3.
"""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.errors import PlaintextError
from engram_sync.shared_format.padding import pad_plaintext, padded_size, padme_length
from engram_sync.shared_format.plaintext import Tombstone, decode_plaintext, tombstone_plaintext
from engram_sync.shared_format.sync_keys import SyncKeys

# (L, padded L): just below, at and just above bucket boundaries. Step 2^(E-S) per range:
# L 2..7 step 1; 8..31 step 2; 32..63 step 4; 64..127 step 8; 128..511 step 16 (S goes
# from 3 to 4 at L = 256, E - S stays 4); 512..1023 step 32; 1024..2047 step 64; ...;
# 32768..65535 step 2048 (E = 15, S = 4); 65536.. step 2048 (E = 16, S = 5); 2^20.. step 2^15.
GOLDEN_LENGTHS = [
    (0, 0), (1, 1), (2, 2), (3, 3),  # the small-L cases of docs/padding.md
    (4, 4), (5, 5), (7, 7),
    (8, 8), (9, 10), (15, 16),
    (16, 16), (17, 18), (31, 32),
    (32, 32), (33, 36), (35, 36), (36, 36), (37, 40), (63, 64),
    (64, 64), (65, 72), (71, 72), (72, 72), (73, 80), (127, 128),
    (128, 128), (129, 144), (143, 144), (144, 144), (145, 160), (255, 256),
    (256, 256), (257, 272), (271, 272), (272, 272), (273, 288), (511, 512),
    (512, 512), (513, 544), (543, 544), (544, 544), (545, 576), (1023, 1024),
    (1024, 1024), (1025, 1088), (1087, 1088), (1088, 1088), (1089, 1152), (2047, 2048),
    (2048, 2048), (2049, 2176), (4095, 4096), (4096, 4096), (4097, 4352),
    (65535, 65536), (65536, 65536), (65537, 67584), (67584, 67584), (67585, 69632),
    (1048575, 1048576), (1048576, 1048576), (1048577, 1081344),
]  # fmt: skip


@pytest.mark.parametrize(("length", "padded"), GOLDEN_LENGTHS)
def test_golden_padme_lengths(length: int, padded: int) -> None:
    assert padme_length(length) == padded


def test_negative_length_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        padme_length(-1)


@given(st.integers(min_value=0, max_value=2**40))
def test_padme_is_a_monotone_bucket_with_bounded_overhead(length: int) -> None:
    padded = padme_length(length)
    assert padded >= length
    assert padme_length(padded) == padded  # a PADMÉ length pads to itself
    assert padme_length(length + 1) >= padded
    if length >= 16:
        assert padded - length < length / 8  # 2^(E-S) ≤ L / 2^S, S ≥ 3 from L = 16


# Padded plaintexts, by hand: the tombstone of mem_1 is {"deleted":true,"id":"mem_1"} =
# 29 bytes → 30 (one space); the golden memory id of §3 gives 44 bytes, a PADMÉ length.
def test_golden_padded_tombstones() -> None:
    assert tombstone_plaintext("mem_1") == '{"deleted":true,"id":"mem_1"}'
    assert pad_plaintext(tombstone_plaintext("mem_1")) == '{"deleted":true,"id":"mem_1"} '
    golden = tombstone_plaintext("mem_1a2b3c4d-5e6f-4a")
    assert len(golden) == 44
    assert pad_plaintext(golden) == golden


def test_padding_counts_utf8_bytes_not_characters() -> None:
    text = '{"c":"' + "é" * 14 + '"}'  # 8 + 28 = 36 bytes, 22 characters
    assert pad_plaintext(text) == text  # 36 is a PADMÉ length
    longer = '{"c":"' + "é" * 15 + '"}'  # 38 bytes → 40
    assert pad_plaintext(longer) == longer + "  "
    assert padded_size(longer) == 40


def test_lone_surrogate_is_a_plaintext_error() -> None:
    with pytest.raises(PlaintextError):
        pad_plaintext('{"c":"\ud800"}')


@given(st.text(max_size=600))
def test_padded_text_is_the_text_plus_spaces(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return
    padded = pad_plaintext(text)
    assert padded.startswith(text)
    assert set(padded[len(text) :]) <= {" "}
    assert len(padded.encode("utf-8")) == padme_length(len(text.encode("utf-8")))


# 89 bytes: E = 6, S = 3, the next multiple of 8 is 96: 7 spaces
MEMORY_JSON = (
    '{"content":"xy","created_at":"2026-08-30T12:00:00+00:00","id":"mem_1","layer":"semantic"}'
)


def test_readers_accept_padded_and_unpadded(golden_keys: SyncKeys) -> None:
    memory_json = MEMORY_JSON
    padded = pad_plaintext(memory_json)
    assert padded == memory_json + " " * 7
    assert decode_plaintext(padded, expected_id="mem_1") == decode_plaintext(memory_json)
    assert json.loads(padded) == json.loads(memory_json)  # a reader with another parser
    tomb = pad_plaintext(tombstone_plaintext("mem_1"))
    assert decode_plaintext(tomb, expected_id="mem_1") == Tombstone(id="mem_1")
    cipher = BlobCipher(golden_keys)
    blob = cipher.seal(
        padded, vault_id="v", memory_id="mem_1", device_id="d", vector_clock=1, deleted=False
    )
    assert len(base64.b64decode(blob.ciphertext)) == 12 + 96 + 16
    assert decode_plaintext(cipher.open(blob), expected_id="mem_1") == decode_plaintext(memory_json)
