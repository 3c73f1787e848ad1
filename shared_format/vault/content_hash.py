"""The normalized content hash stored in `engrams.content_hash` (VAULT §4)."""

from __future__ import annotations

import hashlib
import re
from typing import Final

# VAULT §4: "Unicode whitespace" is the Unicode White_Space property (what Rust's
# `char::is_whitespace` uses). Python's `str.isspace`/`str.split()` also treat the
# information separators U+001C..U+001F as whitespace; they are deliberately absent.
WHITESPACE: Final = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
_WHITESPACE_RUN: Final = re.compile(f"[{re.escape(WHITESPACE)}]+")
_ASCII_DIGITS: Final = frozenset("0123456789")


def _is_dropped_prefix(inner: str) -> bool:
    """Whether the text inside a leading `[...]` marks it as a capture prefix."""
    if all(ch in _ASCII_DIGITS for ch in inner):  # a counter such as [89]; [] counts
        return True
    if len(inner) == 8 and inner[2] == ":" and inner[5] == ":":  # a clock such as [10:23:45]
        return True
    return inner.startswith("/")  # a working directory such as [/home/alice]


def strip_prefixes(content: str) -> str:
    """Trim, then drop leading `[digits]`, `[hh:mm:ss]` and `[/path]` brackets (VAULT §4)."""
    text = content.strip(WHITESPACE)
    while text.startswith("["):
        close = text.find("]")
        if close < 0:
            break
        if not _is_dropped_prefix(text[1:close]):
            break
        text = text[close + 1 :].lstrip(WHITESPACE)
    return text


def normalize_content(content: str) -> str:
    """The text that is hashed: prefixes stripped, whitespace runs collapsed, lowercased."""
    words = [word for word in _WHITESPACE_RUN.split(strip_prefixes(content)) if word]
    return " ".join(words).lower()


def normalized_hash(content: str) -> str:
    """Lowercase hex SHA-256 of the normalized content (VAULT §4 `content_hash`)."""
    # VAULT §4
    return hashlib.sha256(normalize_content(content).encode("utf-8")).hexdigest()
