"""Pairing codes: short one-time codes that hand a new device an API key (our addition).

A code the relay redeems is ``ENG-XXXX-XXXX-XXXX``: 12 symbols of Crockford's
base32 alphabet (``0-9 A-Z`` without ``I L O U``), 60 bits from :mod:`secrets`.
People type codes, so reading is forgiving: case, spaces, hyphens and the
``ENG`` prefix are optional, and the look-alikes ``O`` -> ``0``, ``I``/``L`` ->
``1`` are mapped as Crockford does. The relay stores only
:func:`pairing_code_hash` of the normalised code.

PROTOCOL §14 step 4 (pairing-code path): the code an admin's *client* shows is
``ENG-XXXX-XXXX-XXXX-SSSS-SSSS``. The last 8 symbols (40 bits, same alphabet)
are the secret part, made on the admin's device; it never reaches the relay
(only :attr:`PairingCode.relay_code` is sent) and is the password of the SPAKE2
exchange of :mod:`shared_format.handoff_pake`. A code without the secret part
(``engram-relay pair``, older clients) still redeems; its handoff is then
authenticated by fingerprints. docs/handoff.md has the whole design.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "PAIRING_ALPHABET",
    "PAIRING_CODE_SYMBOLS",
    "PAIRING_PREFIX",
    "PAIRING_SECRET_SYMBOLS",
    "PairingCode",
    "PairingCodeError",
    "is_pairing_id",
    "new_pairing_code",
    "new_pairing_secret",
    "normalize_pairing_code",
    "pairing_code_hash",
    "pairing_id",
    "parse_pairing_code",
    "with_secret",
]

PAIRING_ALPHABET: Final = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32
PAIRING_PREFIX: Final = "ENG"
PAIRING_CODE_SYMBOLS: Final = 12
PAIRING_SECRET_SYMBOLS: Final = 8  # PROTOCOL §14 step 4: 40 bits, never sent to the relay
_GROUP: Final = 4
_LOOKALIKES: Final = str.maketrans({"O": "0", "I": "1", "L": "1"})
_SEPARATORS: Final = str.maketrans("", "", " -_\t")
_PAIRING_ID: Final = re.compile(r"[0-9a-f]{64}")
_SHAPES: Final = {
    PAIRING_CODE_SYMBOLS: "ENG-XXXX-XXXX-XXXX",
    PAIRING_CODE_SYMBOLS + PAIRING_SECRET_SYMBOLS: "ENG-XXXX-XXXX-XXXX-SSSS-SSSS",
}


class PairingCodeError(ValueError):
    """A text is not a pairing code (wrong length or characters); never echoes the text."""


def _groups(symbols: str) -> list[str]:
    return [symbols[i : i + _GROUP] for i in range(0, len(symbols), _GROUP)]


def _format(symbols: str) -> str:
    return "-".join([PAIRING_PREFIX, *_groups(symbols)])


def _random_symbols(count: int) -> str:
    return "".join(secrets.choice(PAIRING_ALPHABET) for _ in range(count))


def new_pairing_code() -> str:
    """A fresh random code, ``ENG-XXXX-XXXX-XXXX`` (the part the relay redeems)."""
    return _format(_random_symbols(PAIRING_CODE_SYMBOLS))


def new_pairing_secret() -> str:
    """A fresh secret part ``SSSS-SSSS`` (made on the admin's device, PROTOCOL §14 step 4)."""
    return "-".join(_groups(_random_symbols(PAIRING_SECRET_SYMBOLS)))


def _compact(text: str, lengths: tuple[int, ...]) -> str:
    compact = text.upper().translate(_SEPARATORS)
    if len(compact) in {len(PAIRING_PREFIX) + n for n in lengths}:
        compact = compact.removeprefix(PAIRING_PREFIX)
    compact = compact.translate(_LOOKALIKES)
    if len(compact) not in lengths:
        shapes = " or ".join(_SHAPES[n] for n in lengths)
        counts = " or ".join(str(n) for n in lengths)
        raise PairingCodeError(
            f"a pairing code has {counts} characters after `{PAIRING_PREFIX}-` ({shapes})"
        )
    if any(ch not in PAIRING_ALPHABET for ch in compact):
        raise PairingCodeError(
            "a pairing code uses only digits and the letters A-Z without I, L, O and U"
        )
    return compact


def normalize_pairing_code(text: str) -> str:
    """The canonical ``ENG-XXXX-XXXX-XXXX`` form of a typed code; PairingCodeError otherwise.

    Only the part the relay redeems: a code with a secret part is refused here
    (the relay must never be sent one); clients use :func:`parse_pairing_code`.
    """
    return _format(_compact(text, (PAIRING_CODE_SYMBOLS,)))


def pairing_code_hash(code: str) -> bytes:
    """SHA-256 of the normalised code: the only form in which the relay keeps it."""
    return hashlib.sha256(normalize_pairing_code(code).encode("ascii")).digest()


def pairing_id(relay_code: str) -> str:
    """The public id of a code, sent with a handoff request so the admin's device finds
    the code's secret part: lowercase hex of :func:`pairing_code_hash` (the relay
    already stores that hash, so the id tells it nothing new)."""
    return pairing_code_hash(relay_code).hex()


def is_pairing_id(text: str) -> bool:
    """True for 64 lowercase hex characters (the shape of :func:`pairing_id`)."""
    return _PAIRING_ID.fullmatch(text) is not None


@dataclass(frozen=True)
class PairingCode:
    """A typed code split into the part the relay redeems and the secret part (or None)."""

    relay_code: str
    secret: str | None = field(default=None, repr=False)

    @property
    def full(self) -> str:
        """The whole code as a person types it (``ENG-…-SSSS-SSSS``, or just the relay part)."""
        return self.relay_code if self.secret is None else f"{self.relay_code}-{self.secret}"

    @property
    def pairing_id(self) -> str:
        """:func:`pairing_id` of the relay part."""
        return pairing_id(self.relay_code)


def parse_pairing_code(text: str) -> PairingCode:
    """Read a typed code with or without its secret part; PairingCodeError otherwise."""
    compact = _compact(text, (PAIRING_CODE_SYMBOLS, PAIRING_CODE_SYMBOLS + PAIRING_SECRET_SYMBOLS))
    relay_code = _format(compact[:PAIRING_CODE_SYMBOLS])
    rest = compact[PAIRING_CODE_SYMBOLS:]
    return PairingCode(relay_code, "-".join(_groups(rest)) if rest else None)


def with_secret(relay_code: str, secret: str) -> PairingCode:
    """The whole code of a relay code and a secret part (both normalised)."""
    return parse_pairing_code(normalize_pairing_code(relay_code) + secret)
