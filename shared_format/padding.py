"""Length padding of plaintexts (PROTOCOL §16, docs/padding.md).

A writer pads the §4 plaintext JSON with trailing ASCII spaces so that its UTF-8
byte length is a PADMÉ length (Nikitin et al. 2019): for L, E = floor(log2 L),
S = floor(log2 E) + 1, and L is rounded up to a multiple of 2^(E-S). The relay then
learns only which bucket a memory's size falls in, and the overhead stays below
1/2^S (at most 12.5% from L = 16 on, a few percent for typical memories).

Small lengths, where the formula is undefined or a no-op: L = 0 stays 0 (no log),
L = 1 stays 1 (E = 0 has no log2), L = 2 and L = 3 stay as they are (E = 1, S = 1,
a multiple of 2^0). No real plaintext is that short (the shortest tombstone has 24
bytes); the cases are defined so the function is total on L ≥ 0.

Readers need nothing: every JSON parser (msgspec, Python's json, serde_json) ignores
trailing whitespace, and `decode_plaintext` accepts padded and unpadded text alike.
"""

from __future__ import annotations

from typing import Final

from .errors import PlaintextError

PAD_BYTE: Final = " "  # ASCII 0x20: JSON whitespace, one byte in UTF-8


def padme_length(length: int) -> int:
    """The PADMÉ length a plaintext of `length` bytes is padded to (PROTOCOL §16)."""
    if length < 0:
        raise ValueError("a length cannot be negative")
    if length < 2:
        return length  # 0 and 1: log2 undefined (L = 0, or E = 0)
    e = length.bit_length() - 1  # floor(log2 L), exact for integers
    s = e.bit_length()  # floor(log2 E) + 1 for E >= 1
    mask = (1 << (e - s)) - 1
    return (length + mask) & ~mask


def _utf8_size(text: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise PlaintextError("plaintext is not valid Unicode (lone surrogate)") from None


def pad_plaintext(text: str) -> str:
    """`text` with trailing spaces up to the PADMÉ length of its UTF-8 bytes (§16)."""
    size = _utf8_size(text)
    return text + PAD_BYTE * (padme_length(size) - size)


def padded_size(text: str) -> int:
    """The UTF-8 byte length of `pad_plaintext(text)`, without building it."""
    return padme_length(_utf8_size(text))
