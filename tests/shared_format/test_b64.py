"""Strict base64 helpers (shared_format.b64)."""

from __future__ import annotations

import base64
import binascii

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_sync.shared_format.b64 import (
    Base64Error,
    b64decode_std,
    b64decoded_len_std,
    b64decoded_lens_std,
    b64encode_std,
    b64url_decode,
    b64url_encode,
)


@given(st.binary(max_size=200))
def test_std_round_trip(data: bytes) -> None:
    text = b64encode_std(data)
    assert text == base64.b64encode(data).decode()
    assert b64decode_std(text) == data


@given(st.binary(max_size=200))
def test_url_round_trip(data: bytes) -> None:
    text = b64url_encode(data)
    assert "=" not in text
    assert "+" not in text
    assert "/" not in text
    assert b64url_decode(text) == data


def test_known_values() -> None:
    assert b64encode_std(b"\xfb\xff") == "+/8="
    assert b64url_encode(b"\xfb\xff") == "-_8"
    assert b64decode_std("AA==") == b"\x00"
    assert b64url_decode("AA") == b"\x00"
    assert b64decode_std("") == b""
    assert b64url_decode("") == b""


@pytest.mark.parametrize(
    "text",
    [
        "AA",  # missing padding
        "AA=",  # short padding
        "AA===",  # too much padding
        "AAA==",  # wrong padding
        "A===",  # impossible length
        "AB==",  # non-canonical trailing bits
        "AAB=",  # non-canonical trailing bits
        "-_8=",  # url alphabet in std
        "AA==AA==",  # padding in the middle
        "=AAA",  # padding first
        "AA==\n",  # trailing newline
        " AA==",  # leading space
        "AA AA==",  # inner space
        "AA\tA",  # tab
        "AAé=",  # non-ASCII
        "\uff21\uff21==",  # fullwidth letters (non-ASCII)
        "A",  # single char
        "AAAAA",  # length not multiple of 4
        "AA==\x00",  # NUL
    ],
)
def test_std_rejects_malformed(text: str) -> None:
    with pytest.raises(Base64Error):
        b64decode_std(text)


@pytest.mark.parametrize(
    "text",
    [
        "AA==",  # padding not accepted
        "AA=",
        "AAA=",
        "+/8",  # std alphabet in url
        "AB",  # non-canonical trailing bits
        "AAB",  # non-canonical trailing bits
        "A",  # impossible length
        "AAAAA",  # impossible length
        "AA\n",
        " AA",
        "A A",
        "AAé",
        "\uff21\uff21",
    ],
)
def test_url_rejects_malformed(text: str) -> None:
    with pytest.raises(Base64Error):
        b64url_decode(text)


def test_base64error_is_valueerror() -> None:
    assert issubclass(Base64Error, ValueError)


def test_non_str_rejected() -> None:
    with pytest.raises(Base64Error):
        b64decode_std(b"AA==")  # type: ignore[arg-type]
    with pytest.raises(Base64Error):
        b64url_decode(b"AA")  # type: ignore[arg-type]


def test_messages_do_not_echo_input() -> None:
    secret = "c2VjcmV0LXNlY3JldA=" + "!"
    with pytest.raises(Base64Error) as info:
        b64decode_std(secret)
    assert "c2VjcmV0" not in str(info.value)
    with pytest.raises(Base64Error) as info2:
        b64url_decode("c2VjcmV0LXNlY3JldA==")
    assert "c2VjcmV0" not in str(info2.value)


@given(st.binary(min_size=1, max_size=64), st.integers(min_value=0, max_value=10_000))
def test_std_single_bit_damage_in_last_char_never_silently_accepted(data: bytes, seed: int) -> None:
    # Any other text that decodes must be the canonical encoding of its bytes.
    text = b64encode_std(data)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    stripped = text.rstrip("=")
    pos = seed % len(stripped)
    replacement = alphabet[(alphabet.index(stripped[pos]) + 1 + seed) % 64]
    mutated = text[:pos] + replacement + text[pos + 1 :]
    try:
        decoded = b64decode_std(mutated)
    except Base64Error:
        return
    assert b64encode_std(decoded) == mutated


def _reference_decode_std(text: str) -> bytes | None:
    """The definition: decodes with validation and re-encodes to exactly the input."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if base64.b64encode(data).decode("ascii") == text else None


@given(
    st.text(alphabet="ABCDQRSTwxyz0189+/=", max_size=16)
    | st.binary(max_size=12).map(lambda b: base64.b64encode(b).decode())
)
def test_fast_path_agrees_with_the_definition(text: str) -> None:
    expected = _reference_decode_std(text)
    if expected is None:
        with pytest.raises(Base64Error):
            b64decode_std(text)
    else:
        assert b64decode_std(text) == expected


def _outcome(measure: object, text: str) -> int | str:
    try:
        return measure(text)  # type: ignore[operator,no-any-return]
    except Base64Error as exc:
        return f"refused: {exc}"


_NEAR_BASE64 = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_ \n\x00é",
    max_size=12,
)


@given(st.one_of(st.binary(max_size=64).map(b64encode_std), _NEAR_BASE64,
                 st.binary(min_size=1, max_size=64).map(b64encode_std).flatmap(
                     lambda t: st.integers(0, len(t) - 1).flatmap(
                         lambda i: st.sampled_from("AQgw+/=Bb9").map(
                             lambda c: t[:i] + c + t[i + 1 :])))))  # fmt: skip
def test_the_decoded_length_is_the_decoders_without_decoding(text: str) -> None:
    """Issue 36: `b64decoded_len_std` answers what `len(b64decode_std(...))` answers, or
    refuses with the same error, for canonical text, near-base64 text and canonical text
    with one character changed (trailing bits, padding in the wrong place)."""
    assert _outcome(b64decoded_len_std, text) == _outcome(lambda t: len(b64decode_std(t)), text)


_ONE_CHANGED = st.binary(min_size=1, max_size=64).map(b64encode_std).flatmap(
    lambda t: st.integers(0, len(t) - 1).flatmap(
        lambda i: st.sampled_from("AQgw+/=Bb9é").map(
            lambda c: t[:i] + c + t[i + 1 :])))  # fmt: skip


@given(st.lists(st.one_of(st.binary(min_size=1, max_size=64).map(b64encode_std),
                          _ONE_CHANGED, _NEAR_BASE64), min_size=1, max_size=6))  # fmt: skip
def test_the_lengths_at_once_are_each_text_s_or_none(texts: list[str]) -> None:
    """Issue 36: `b64decoded_lens_std` gives every text's `b64decoded_len_std` when each is
    canonical, and None when any one is refused (or empty, which the text-by-text path
    judges): never a length for a text the decoder refuses."""
    each = [_outcome(b64decoded_len_std, t) for t in texts]
    at_once = b64decoded_lens_std(texts)
    if all(isinstance(n, int) and t for n, t in zip(each, texts, strict=True)):
        assert at_once == each
    else:
        assert at_once is None


def test_the_lengths_at_once_refuse_what_only_the_whole_shows() -> None:
    """'=' where another text's padding would account for it, and trailing bits."""
    assert b64decoded_lens_std(["QUI=", "QUJD"]) == [2, 3]
    assert b64decoded_lens_std(["QQ==", "QUJD"]) == [1, 3]
    assert b64decoded_lens_std(["QU==", "QUJD"]) is None  # "U" has low bits set
    assert b64decoded_lens_std(["QUJD", "QU=D"]) is None  # one '=' inside, none at the end
    assert b64decoded_lens_std(["QUI=", "Q=JD", "QUJD"]) is None
    assert b64decoded_lens_std(["QUJ=", "QUJD"]) is None  # 'J' has low bits set
    assert b64decoded_lens_std(["QUJD", "QUJ\u00e9"]) is None
    assert b64decoded_lens_std(["QUJD", ""]) is None
