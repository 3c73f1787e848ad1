"""shared_format.digest: the version hash and bucket of PROTOCOL §18, and the one-state form
of both that the relay's push uses."""

from __future__ import annotations

import hashlib

from hypothesis import example, given
from hypothesis import strategies as st

from engram_sync.shared_format.digest import bucket_and_version_hash, bucket_of, version_hash

ids = st.text(min_size=1, max_size=80)
clocks = st.integers(min_value=0, max_value=2**63 - 1)


def _spec_hash(memory_id: str, device_id: str, clock: int, deleted: bool) -> int:
    """SHA-256(memory_id ‖ 0x00 ‖ device_id ‖ 0x00 ‖ u64_LE(vector_clock) ‖ deleted byte),
    written out from PROTOCOL §18's text."""
    message = (
        memory_id.encode("utf-8", "surrogatepass")
        + b"\x00"
        + device_id.encode("utf-8", "surrogatepass")
        + b"\x00"
        + clock.to_bytes(8, "little")
        + (b"\x01" if deleted else b"\x00")
    )
    return int.from_bytes(hashlib.sha256(message).digest(), "big")


def test_the_version_hash_and_bucket_follow_the_protocol_text() -> None:
    assert version_hash("m-1", "dev-a", 7, False) == _spec_hash("m-1", "dev-a", 7, False)
    assert version_hash("m-1", "dev-a", 7, True) == _spec_hash("m-1", "dev-a", 7, True)
    assert version_hash("m-1", "dev-a", 7, True) != version_hash("m-1", "dev-a", 7, False)
    assert bucket_of("m-1") == hashlib.sha256(b"m-1").digest()[0]


@given(ids, ids, clocks, st.booleans())
@example("\ud800half", "dev", 0, False)  # a lone surrogate, as "surrogatepass" encodes it
@example("m", "d\ud83d", 2**63 - 1, True)
def test_one_state_gives_the_bucket_and_the_version_hash(
    memory_id: str, device_id: str, clock: int, deleted: bool
) -> None:
    both = bucket_and_version_hash(memory_id, device_id, clock, deleted)
    assert both == (bucket_of(memory_id), version_hash(memory_id, device_id, clock, deleted))
    assert both[1] == _spec_hash(memory_id, device_id, clock, deleted)
