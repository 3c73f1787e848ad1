"""`b64decoded_len_std` (issue 36: a pushed blob's lengths without decoding) against the
decoder for every place one or two '=' can stand in short texts: a deterministic probe of
what the property test of tests/shared_format/test_b64.py finds only by chance (padding in
the middle, with the right count, before a character whose low bits are zero)."""

from __future__ import annotations

import itertools

from engram_sync.shared_format.b64 import Base64Error, b64decode_std, b64decoded_len_std


def _outcome(measure: object, text: str) -> int | str:
    try:
        return measure(text)  # type: ignore[operator,no-any-return]
    except Base64Error as exc:
        return f"refused: {exc}"


def _texts() -> list[str]:
    """Every 4- and 8-character text of 'A', 'Q', 'g' (low bits zero and not) and '=' ."""
    return ["".join(t) for n in (4, 8) for t in itertools.product("AQg=", repeat=n)]


def test_padding_anywhere_is_judged_as_the_decoder_judges_it() -> None:
    texts = _texts()
    assert "A=AA" in texts  # '=' in the middle, one of them, as if it were padding
    assert "AA==" in texts  # canonical
    for text in texts:
        expected = _outcome(lambda t: len(b64decode_std(t)), text)
        assert _outcome(b64decoded_len_std, text) == expected, text
