"""Recovery phrases (PROTOCOL §13, shared_format.recovery)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mnemonic import Mnemonic

from engram_sync.shared_format.errors import KeyUnwrapError, RecoveryPhraseError
from engram_sync.shared_format.recovery import (
    generate_recovery_phrase,
    normalize_recovery_phrase,
    validate_recovery_phrase,
)
from engram_sync.shared_format.wraps import new_account_key, unwrap_with_secret, wrap_with_secret

WORDLIST: list[str] = list(Mnemonic("english").wordlist)
WORDS = frozenset(WORDLIST)
# BIP39 test vector: 128 zero bits.
VECTOR = " ".join(["abandon"] * 11 + ["about"])


def test_generated_phrase_shape() -> None:
    phrase = generate_recovery_phrase()
    words = phrase.split(" ")
    assert len(words) == 12
    assert all(w in WORDS for w in words)
    assert phrase == phrase.lower().strip()
    assert "  " not in phrase
    assert Mnemonic("english").check(phrase)
    assert validate_recovery_phrase(phrase) == phrase


def test_generated_phrases_differ() -> None:
    phrases = {generate_recovery_phrase() for _ in range(20)}
    assert len(phrases) == 20


def test_known_vector_is_valid() -> None:
    assert validate_recovery_phrase(VECTOR) == VECTOR


def test_normalize() -> None:
    messy = "  Abandon\tABANDON \n abandon" + " abandon" * 8 + "\u00a0 About  "
    assert normalize_recovery_phrase(messy) == VECTOR
    assert validate_recovery_phrase(messy) == VECTOR
    assert normalize_recovery_phrase("") == ""


@given(st.lists(st.sampled_from([" ", "  ", "\t", "\n", " \r\n "]), min_size=13, max_size=13))
def test_normalize_any_whitespace(seps: list[str]) -> None:
    words = VECTOR.split(" ")
    text = seps[0] + "".join(w + s for w, s in zip(words, seps[1:], strict=True))
    assert normalize_recovery_phrase(text.upper()) == VECTOR


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("", 0),
        ("   ", 0),
        (" ".join(["abandon"] * 11), 11),
        (VECTOR + " abandon", 13),
        (" ".join(["abandon"] * 23 + ["art"]), 24),  # a valid 24-word BIP39 phrase
    ],
)
def test_wrong_word_count(text: str, count: int) -> None:
    with pytest.raises(RecoveryPhraseError, match=f"this one has {count}\\b") as info:
        validate_recovery_phrase(text)
    assert "12 words" in str(info.value)


def test_unknown_word_is_named_with_position() -> None:
    text = " ".join(["abandon"] * 4 + ["xyz"] + ["abandon"] * 6 + ["about"])
    with pytest.raises(RecoveryPhraseError, match=r'unknown word "xyz" \(word 5\)'):
        validate_recovery_phrase(text)


def test_unknown_long_word_is_truncated() -> None:
    text = " ".join(["q" * 200] + ["abandon"] * 10 + ["about"])
    with pytest.raises(RecoveryPhraseError, match="unknown word") as info:
        validate_recovery_phrase(text)
    assert "q" * 25 not in str(info.value)


def _bad_checksum_phrase() -> str:
    prefix = ["abandon"] * 11
    for last in WORDLIST:
        candidate = " ".join([*prefix, last])
        if not Mnemonic("english").check(candidate):
            return candidate
    raise AssertionError("unreachable")


def test_bad_checksum() -> None:
    text = _bad_checksum_phrase()
    with pytest.raises(RecoveryPhraseError, match="checksum") as info:
        validate_recovery_phrase(text)
    assert "abandon" not in str(info.value)


def test_swapped_words_fail_checksum() -> None:
    # Swapping two distinct words of a valid phrase keeps word count and words valid.
    while True:
        words = generate_recovery_phrase().split(" ")
        words[0], words[1] = words[1], words[0]
        swapped = " ".join(words)
        if words[0] != words[1] and not Mnemonic("english").check(swapped):
            break
    with pytest.raises(RecoveryPhraseError, match="checksum"):
        validate_recovery_phrase(swapped)


def test_phrase_is_the_recovery_wrap_secret() -> None:
    # Two Argon2id derivations: wrap with the generated phrase, unwrap with a messy copy.
    phrase = generate_recovery_phrase()
    a = new_account_key()
    wrapped_a_rec, salt_rec = wrap_with_secret(a, validate_recovery_phrase(phrase))
    typed = "  " + phrase.upper().replace(" ", " \t ") + "\n"
    assert unwrap_with_secret(wrapped_a_rec, salt_rec, validate_recovery_phrase(typed)) == a


def test_other_phrase_does_not_unwrap() -> None:
    a = new_account_key()
    wrapped, salt = wrap_with_secret(a, VECTOR)
    with pytest.raises(KeyUnwrapError):
        unwrap_with_secret(wrapped, salt, generate_recovery_phrase())
