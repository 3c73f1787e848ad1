"""The stored bucket prefixes and counts of a vault (PROTOCOL §18, docs/digest.md).

`vaults.bucket_prefixes` (256 x 8 bytes: the first 8 bytes of each bucket's digest, bucket
order) and `vaults.bucket_counts` (256 sizes, big-endian u32), revision 0012. The digest is
an XOR, so a version put in or taken out changes its bucket's 8 bytes by the top 64 bits
of its hash.
Writers (relay.store.push, relay.store.compaction) gather the changes of one transaction
per bucket and apply them here once per vault, under the vault row lock they hold.
"""

from __future__ import annotations

import struct
from typing import Final

from engram_sync.shared_format.digest import BUCKETS, DIGEST_BYTES, PREFIX_BYTES

ZERO_PREFIXES: Final = bytes(BUCKETS * PREFIX_BYTES)
ZERO_COUNTS: Final = bytes(BUCKETS * 4)
_WORD: Final = struct.Struct(">Q")
_COUNT: Final = struct.Struct(">I")
_COUNTS: Final = struct.Struct(f">{BUCKETS}I")
#: A version hash (an int, `version_hash`) shifted right by this is its first 8 bytes.
PREFIX_SHIFT: Final = (DIGEST_BYTES - PREFIX_BYTES) * 8


def apply_changes(
    prefixes: bytes, counts: bytes, xors: dict[int, int], added: dict[int, int]
) -> tuple[bytes, bytes]:
    """The prefixes with each bucket's 8 bytes XORed by `xors[bucket]` and the counts
    moved by `added[bucket]` (new values; the inputs are left alone)."""
    out = bytearray(prefixes)
    for bucket, change in xors.items():
        (word,) = _WORD.unpack_from(out, PREFIX_BYTES * bucket)
        _WORD.pack_into(out, PREFIX_BYTES * bucket, word ^ change)
    moved = bytearray(counts)
    for bucket, n in added.items():
        (count,) = _COUNT.unpack_from(moved, 4 * bucket)
        # never below 0: a count can only be off after rows were written outside the
        # push and compaction, and then a maintenance round must not fail on it
        _COUNT.pack_into(moved, 4 * bucket, max(0, count + n))
    return bytes(out), bytes(moved)


def count_list(counts: bytes) -> list[int]:
    """The 256 counts of a stored `bucket_counts` value."""
    return list(_COUNTS.unpack(counts))
