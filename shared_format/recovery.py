"""Recovery phrases: 12 BIP39 English words (PROTOCOL §13).

The normalised phrase (lowercase, single spaces) is the secret of the recovery
wrap (``wrapped_a_rec``/``salt_rec``): pass the result of
:func:`validate_recovery_phrase` to :func:`shared_format.wraps.wrap_with_secret`
and :func:`shared_format.wraps.unwrap_with_secret`.
"""

from __future__ import annotations

import secrets
from functools import lru_cache

from mnemonic import Mnemonic

from .errors import RecoveryPhraseError

__all__ = [
    "RECOVERY_PHRASE_WORDS",
    "generate_recovery_phrase",
    "normalize_recovery_phrase",
    "validate_recovery_phrase",
]

RECOVERY_PHRASE_WORDS = 12
_ENTROPY_BYTES = 16  # 128 bits -> 12 words (4 checksum bits)
_MAX_SHOWN = 24  # longest unknown word echoed back in an error message


@lru_cache(maxsize=1)
def _english() -> Mnemonic:
    return Mnemonic("english")


@lru_cache(maxsize=1)
def _wordset() -> frozenset[str]:
    return frozenset(str(w) for w in _english().wordlist)


def generate_recovery_phrase() -> str:
    """12 BIP39 English words from 128 bits of ``secrets`` entropy, single spaces."""
    # PROTOCOL §13: 12 BIP39 English words, lowercase, single spaces.
    phrase = str(_english().to_mnemonic(secrets.token_bytes(_ENTROPY_BYTES)))
    return normalize_recovery_phrase(phrase)


def normalize_recovery_phrase(text: str) -> str:
    """Lowercase, collapse every run of whitespace to one space, strip the ends."""
    return " ".join(text.lower().split())


def validate_recovery_phrase(text: str) -> str:
    """Normalise and check a phrase; return the normalised phrase (the wrap secret).

    Raises RecoveryPhraseError naming the problem: word count, the first unknown
    word (as typed, since the person needs to find the typo), or a bad checksum.
    """
    phrase = normalize_recovery_phrase(text)
    words = phrase.split(" ") if phrase else []
    if len(words) != RECOVERY_PHRASE_WORDS:
        raise RecoveryPhraseError(
            f"a recovery phrase has {RECOVERY_PHRASE_WORDS} words, this one has {len(words)}"
        )
    known = _wordset()
    for position, word in enumerate(words, start=1):
        if word not in known:
            shown = word if len(word) <= _MAX_SHOWN else word[:_MAX_SHOWN] + "..."
            raise RecoveryPhraseError(
                f'unknown word "{shown}" (word {position}): not in the BIP39 English word list'
            )
    if not _english().check(phrase):
        raise RecoveryPhraseError(
            "the recovery phrase checksum does not match: a word is wrong or words are swapped"
        )
    return phrase
