"""VAULT §4 normalized content hash: golden value, prefix rules, whitespace rules."""

from __future__ import annotations

import hashlib
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_sync.shared_format.vault import normalize_content, normalized_hash, strip_prefixes
from engram_sync.shared_format.vault.content_hash import WHITESPACE


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_golden_value() -> None:
    content = "[89] [10:23:45] [/home/alice/engram] Cargo  check"
    expected = "b5c4730cc1cc8640381bddc0f450faa777a9366949e75c13904665ed41a8c531"
    assert normalized_hash(content) == expected
    assert normalized_hash("cargo check") == expected


@pytest.mark.parametrize(
    ("content", "normalized"),
    [
        ("[] hello", "hello"),  # empty bracket counts as all digits
        ("[]hello", "hello"),
        ("[abc] hello", "[abc] hello"),  # not a prefix: stop
        ("[89] [abc] [10:23:45] x", "[abc] [10:23:45] x"),  # stops at the first non-prefix
        ("[12 no close", "[12 no close"),  # `[` without `]`
        ("[89][90]x", "x"),
        ("[89]", ""),
        ("[ab:cd:ef] x", "x"),  # 8 characters with `:` at the 3rd and 6th
        ("[1:23:456] x", "[1:23:456] x"),  # 8 characters, colons elsewhere
        ("[10:23:45.1] x", "[10:23:45.1] x"),  # 10 characters
        ("[/tmp] x", "x"),
        ("[ /tmp] x", "[ /tmp] x"),  # does not start with `/`
        ("[12a] x", "[12a] x"),
        ("[\uff11\uff12] x", "[\uff11\uff12] x"),  # fullwidth digits are not ASCII digits
        ("  \t[89]\n  Hello   World \n", "hello world"),
        ("x [89] y", "x [89] y"),  # only leading brackets
        ("[89] ]x", "]x"),
        ("", ""),
        ("   ", ""),
    ],
)
def test_prefix_rules(content: str, normalized: str) -> None:
    assert normalize_content(content) == normalized
    assert normalized_hash(content) == sha(normalized)


def test_information_separators_are_not_whitespace() -> None:
    # Python's str.split() would split (and strip) on U+001C..U+001F; the format must not.
    for separator in "\x1c\x1d\x1e\x1f":
        content = f"{separator}Alpha{separator}beta  Gamma{separator}"
        assert normalize_content(content) == f"{separator}alpha{separator}beta gamma{separator}"
        assert normalized_hash(content) != normalized_hash(content.replace(separator, " "))
    assert strip_prefixes("[89]\x1cx") == "\x1cx"


def test_unicode_whitespace_splits() -> None:
    assert normalize_content("a\u3000b\u00a0c\u2028d\u0085e\u200af\tg\x0bh") == "a b c d e f g h"
    assert normalize_content("\u3000[89]\u2003x\u205f") == "x"


def test_whitespace_set_is_unicode_white_space() -> None:
    # The Unicode White_Space property: Python's isspace() minus the four separators.
    python_space = {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}
    assert set(WHITESPACE) == python_space - set("\x1c\x1d\x1e\x1f")


def test_non_ascii_lowercasing() -> None:
    assert normalize_content("ÉCOLE Straße ΣΟΦΟΣ") == "école straße σοφος"


# Words without `[` so that no bracket prefix spans a whitespace gap.
words = st.text(
    alphabet=st.characters(blacklist_characters=WHITESPACE + "[", blacklist_categories=["Cs"]),
    min_size=1,
)
spaces = st.text(alphabet=st.sampled_from(WHITESPACE), min_size=1, max_size=4)


@given(st.text())
def test_hash_is_lowercase_hex(content: str) -> None:
    digest = normalized_hash(content)
    assert len(digest) == 64
    assert digest == digest.lower()
    int(digest, 16)


@given(st.lists(words, min_size=1), st.lists(spaces, min_size=1))
def test_whitespace_runs_do_not_matter(parts: list[str], gaps: list[str]) -> None:
    spaced = "".join(part + gaps[i % len(gaps)] for i, part in enumerate(parts))
    assert normalized_hash(gaps[0] + spaced) == normalized_hash(" ".join(parts))


@given(st.text(), st.sampled_from(["[89] ", "[] ", "[10:23:45]", "[/home/a b] ", "\t[7]\n"]))
def test_known_prefix_does_not_matter(content: str, prefix: str) -> None:
    assert normalized_hash(prefix + content) == normalized_hash(content)


@given(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E)))
def test_ascii_case_does_not_matter(content: str) -> None:
    assert normalized_hash(content.upper()) == normalized_hash(content.lower())


@given(st.text())
def test_normalization_is_idempotent(content: str) -> None:
    once = normalize_content(content)
    # Re-normalizing can only strip further prefixes; without a leading `[` it is a fixpoint.
    if not once.startswith("["):
        assert normalize_content(once) == once
