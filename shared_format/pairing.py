"""Pairing codes: short one-time codes that hand a new device an API key (our addition).

A code is ``ENG-XXXX-XXXX-XXXX``: 12 symbols of Crockford's base32 alphabet
(``0-9 A-Z`` without ``I L O U``), 60 bits from :mod:`secrets`. People type
codes, so reading is forgiving: case, spaces, hyphens and the ``ENG`` prefix
are optional, and the look-alikes ``O`` -> ``0``, ``I``/``L`` -> ``1`` are
mapped as Crockford does. The relay stores only :func:`pairing_code_hash` of
the normalised code.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Final

__all__ = [
    "PAIRING_ALPHABET",
    "PAIRING_CODE_SYMBOLS",
    "PAIRING_PREFIX",
    "PairingCodeError",
    "new_pairing_code",
    "normalize_pairing_code",
    "pairing_code_hash",
]

PAIRING_ALPHABET: Final = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32
PAIRING_PREFIX: Final = "ENG"
PAIRING_CODE_SYMBOLS: Final = 12
_GROUP: Final = 4
_LOOKALIKES: Final = str.maketrans({"O": "0", "I": "1", "L": "1"})
_SEPARATORS: Final = str.maketrans("", "", " -_\t")


class PairingCodeError(ValueError):
    """A text is not a pairing code (wrong length or characters); never echoes the text."""


def _format(symbols: str) -> str:
    groups = [symbols[i : i + _GROUP] for i in range(0, PAIRING_CODE_SYMBOLS, _GROUP)]
    return "-".join([PAIRING_PREFIX, *groups])


def new_pairing_code() -> str:
    """A fresh random code, ``ENG-XXXX-XXXX-XXXX``."""
    return _format("".join(secrets.choice(PAIRING_ALPHABET) for _ in range(PAIRING_CODE_SYMBOLS)))


def normalize_pairing_code(text: str) -> str:
    """The canonical ``ENG-XXXX-XXXX-XXXX`` form of a typed code; PairingCodeError otherwise."""
    compact = text.upper().translate(_SEPARATORS)
    if len(compact) == len(PAIRING_PREFIX) + PAIRING_CODE_SYMBOLS:
        compact = compact.removeprefix(PAIRING_PREFIX)
    compact = compact.translate(_LOOKALIKES)
    if len(compact) != PAIRING_CODE_SYMBOLS:
        raise PairingCodeError(
            f"a pairing code has {PAIRING_CODE_SYMBOLS} characters after `{PAIRING_PREFIX}-` "
            "(ENG-XXXX-XXXX-XXXX)"
        )
    if any(ch not in PAIRING_ALPHABET for ch in compact):
        raise PairingCodeError(
            "a pairing code uses only digits and the letters A-Z without I, L, O and U"
        )
    return _format(compact)


def pairing_code_hash(code: str) -> bytes:
    """SHA-256 of the normalised code: the only form in which the relay keeps it."""
    return hashlib.sha256(normalize_pairing_code(code).encode("ascii")).digest()
