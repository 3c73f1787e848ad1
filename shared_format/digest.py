"""The anti-entropy digest (PROTOCOL §18, docs/digest.md), shared by the relay and the client.

One version of a memory hashes to SHA-256(memory_id ‖ 0x00 ‖ device_id ‖ 0x00 ‖
u64_LE(vector_clock) ‖ deleted byte); a set of versions (a vault, or one bucket of it)
to the XOR of its versions' hashes, so a version can be taken out or put in in O(1).
A memory's bucket is the first byte of SHA-256(memory_id).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from functools import lru_cache
from hashlib import sha256
from typing import Annotated, Final, NamedTuple

import msgspec
from msgspec import UNSET, Meta, UnsetType

from .b64 import b64encode_std
from .wire import SyncBlob, VectorClock

DIGEST_BYTES: Final = 32
BUCKETS: Final = 256
EMPTY_DIGEST: Final = bytes(DIGEST_BYTES)
# u64_LE(vector_clock) ‖ the deleted byte (0x01 or 0x00): the end of a version's message
_TAIL: Final = struct.Struct("<Q?")


class Version(NamedTuple):
    """One memory's version as the digest sees it."""

    memory_id: str
    device_id: str
    vector_clock: int
    deleted: bool


def version_hash(memory_id: str, device_id: str, vector_clock: int, deleted: bool) -> int:
    """The version's SHA-256 as a 256-bit integer (XOR-able at Python speed)."""
    message = memory_id.encode("utf-8", "surrogatepass") + _device_part(device_id)
    return int.from_bytes(sha256(message + _TAIL.pack(vector_clock, deleted)).digest(), "big")


def bucket_and_version_hash(
    memory_id: str, device_id: str, vector_clock: int, deleted: bool
) -> tuple[int, int]:
    """(`bucket_of(memory_id)`, `version_hash(...)`) from one SHA-256 state: the version's
    message begins with the memory id, whose own hash is the bucket (what a push does for
    every blob it accepts)."""
    state = sha256(memory_id.encode("utf-8", "surrogatepass"))
    bucket = state.digest()[0]
    state.update(_device_part(device_id) + _TAIL.pack(vector_clock, deleted))
    return bucket, int.from_bytes(state.digest(), "big")


@lru_cache(maxsize=1024)
def _device_part(device_id: str) -> bytes:
    """0x00 ‖ device_id ‖ 0x00 of a version's message, encoded once per device: the blobs
    of a push are mostly one device's (bounded: 1,024 devices' ids at most)."""
    return b"\x00" + device_id.encode("utf-8", "surrogatepass") + b"\x00"


def bucket_of(memory_id: str) -> int:
    """The memory's bucket: the first byte of SHA-256(memory_id), 0..255."""
    return sha256(memory_id.encode("utf-8", "surrogatepass")).digest()[0]


def slot_of(memory_id: str) -> tuple[int, int]:
    """(bucket, sub-bucket) of the memory from one hash: the first and second bytes of
    SHA-256(memory_id) (the sub-bucket narrows one bucket, `POST .../digest/narrow`)."""
    head = sha256(memory_id.encode("utf-8", "surrogatepass")).digest()
    return head[0], head[1]


def digest_bytes(value: int) -> bytes:
    """A 256-bit XOR value as its 32 bytes (big-endian, as SHA-256 prints them)."""
    return value.to_bytes(DIGEST_BYTES, "big")


def digest_int(value: bytes) -> int:
    """32 digest bytes as the integer `version_hash` XORs into."""
    return int.from_bytes(value, "big")


def digest_text(value: int) -> str:
    """The wire form: standard base64 with padding of the 32 bytes."""
    return b64encode_std(digest_bytes(value))


def fold(versions: Iterable[Version]) -> tuple[int, int]:
    """(XOR of the versions' hashes, how many) over a set of versions."""
    value = 0
    count = 0
    for v in versions:
        value ^= version_hash(v.memory_id, v.device_id, v.vector_clock, v.deleted)
        count += 1
    return value, count


# --- wire (PROTOCOL §18; docs/digest.md for what is ours) ---------------------------------

MAX_LIST_PAGE: Final = 2000  # entries per `?bucket=B&list=1` answer
MAX_FETCH_IDS: Final = 1000  # memory ids per fetch
PREFIX_BYTES: Final = 8  # of each bucket digest in `?buckets=1` (a 2^-64 chance to miss)
SUB_BUCKETS: Final = 256  # per bucket, by the second byte of SHA-256(memory_id)
MAX_NARROW_PAGE: Final = 2000  # entries per `POST .../digest/narrow` answer
MAX_NARROW_BODY: Final = 8192  # bytes of a narrow request (the subs are 2,732 of them)


def bucket_prefixes(digests: dict[int, int]) -> bytes:
    """The `buckets` bytes of `?buckets=1`: PREFIX_BYTES of each bucket's digest, 0..255."""
    return b"".join(digest_bytes(digests.get(b, 0))[:PREFIX_BYTES] for b in range(BUCKETS))


class DigestEntry(msgspec.Struct, frozen=True, array_like=True):
    """One version in a bucket list: [memory_id, device_id, vector_clock, deleted]."""

    memory_id: str
    device_id: str
    vector_clock: VectorClock
    deleted: bool


class DigestAnswer(msgspec.Struct, frozen=True):
    """`GET /v1/vaults/{v}/digest`: the vault, one bucket (`bucket`), one bucket's list
    (`entries`, `has_more`), or every bucket at once (`?buckets=1`, ours: `buckets` =
    base64 of the first PREFIX_BYTES bytes of each of the 256 bucket digests, in bucket
    order, and `counts` their sizes), so narrowing a mismatch to its buckets is one
    answer of about 4 KB."""

    cursor: Annotated[int, Meta(ge=0)]
    count: Annotated[int, Meta(ge=0)]
    digest: str
    bucket: int | UnsetType = UNSET
    entries: list[DigestEntry] | UnsetType = UNSET
    has_more: bool | UnsetType = UNSET
    buckets: str | UnsetType = UNSET
    counts: list[Annotated[int, Meta(ge=0)]] | UnsetType = UNSET


class NarrowRequest(msgspec.Struct, frozen=True):
    """`POST /v1/vaults/{v}/digest/narrow` (ours, docs/digest.md): one bucket, and the
    device's PREFIX_BYTES of each of its 256 sub-bucket digests (base64, in sub-bucket
    order); the relay answers the versions of the sub-buckets whose digests differ,
    after `after` (paging)."""

    bucket: Annotated[int, Meta(ge=0, le=BUCKETS - 1)]
    subs: Annotated[str, Meta(max_length=4 * SUB_BUCKETS * PREFIX_BYTES // 3 + 4)]
    after: Annotated[str, Meta(max_length=256)] = ""


class NarrowAnswer(msgspec.Struct, frozen=True):
    """The bucket's cursor, count and digest (one snapshot with the rest), the sub-buckets
    whose digests differ from the device's (ascending), and the versions of those
    sub-buckets ordered by memory_id after `after`, at most MAX_NARROW_PAGE of them
    (`has_more`: ask again with `after` = the last memory_id)."""

    cursor: Annotated[int, Meta(ge=0)]
    count: Annotated[int, Meta(ge=0)]
    digest: str
    bucket: int
    subs: list[int]
    entries: list[DigestEntry]
    has_more: bool


class FetchRequest(msgspec.Struct, frozen=True):
    """`POST /v1/vaults/{v}/fetch` (ours, docs/digest.md): current versions by memory id."""

    memory_ids: list[str]


class FetchResponse(msgspec.Struct, frozen=True):
    """The current blob of each memory asked for that the relay holds; `has_more` when the
    byte budget ended the answer early (ask again for the rest)."""

    blobs: list[SyncBlob]
    has_more: bool = False
