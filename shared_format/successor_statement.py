"""The successor statement of a re-key (PROTOCOL §19, last bullet; docs/rekey.md "The
successor statement").

The relay names the successor of a retired vault, but the relay is untrusted: the device
that re-keys writes a statement only holders of the old vault's keys can make,

    HMAC-SHA256(old hmac_key, "engram-successor-v1" ‖ 0x00 ‖ old vault_id ‖ 0x00 ‖
                successor vault_id ‖ 0x00 ‖ retired_at)

(each text UTF-8; `retired_at` the exact text the device chose, e.g. its UTC RFC 3339 time),
and a follower checks it under the old hmac_key it already holds before it follows. On the
wire the 32-byte MAC is standard base64 (44 characters), `statement` beside `stated_at`.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final

from .b64 import Base64Error, b64decode_std, b64encode_std

TAG: Final = b"engram-successor-v1"
MAC_BYTES: Final = 32
STATEMENT_CHARS: Final = 44  # base64 of MAC_BYTES
MAX_STATED_AT_BYTES: Final = 64  # relay revision 0016 bounds the column to it
MAX_VAULT_ID_BYTES: Final = 1024  # PROTOCOL §6 step 1 allows 256 characters


class StatementError(ValueError):
    """A field cannot go into a statement (empty, too long, or holding a 0x00)."""


def _field(value: str, name: str, limit: int) -> bytes:
    raw = value.encode("utf-8")
    if not raw or len(raw) > limit or b"\x00" in raw:
        # 0x00 separates the fields: a field holding one could stand for two
        raise StatementError(f"{name} must be 1..{limit} bytes of text without a NUL")
    return raw


def statement_message(old_vault_id: str, successor: str, stated_at: str) -> bytes:
    """The bytes the MAC covers (PROTOCOL §19)."""
    return b"\x00".join(
        (
            TAG,
            _field(old_vault_id, "old vault id", MAX_VAULT_ID_BYTES),
            _field(successor, "successor", MAX_VAULT_ID_BYTES),
            _field(stated_at, "stated_at", MAX_STATED_AT_BYTES),
        )
    )


def make_statement(hmac_key: bytes, old_vault_id: str, successor: str, stated_at: str) -> str:
    """The statement (base64 of the MAC) that `successor` replaced `old_vault_id`."""
    if len(hmac_key) != 32:
        raise StatementError("the hmac key must be 32 bytes")
    mac = hmac.new(hmac_key, statement_message(old_vault_id, successor, stated_at), hashlib.sha256)
    return b64encode_std(mac.digest())


def statement_verifies(
    hmac_key: bytes,
    old_vault_id: str,
    successor: str,
    stated_at: object,
    statement: object,
) -> bool:
    """True only when `statement` is the MAC, under the old vault's `hmac_key`, of exactly
    this (old vault, successor, stated_at); anything else (missing, malformed, another
    successor, another vault's key) is False. Constant-time comparison."""
    if not isinstance(stated_at, str) or not isinstance(statement, str):
        return False
    if len(statement) != STATEMENT_CHARS:
        return False
    try:
        given = b64decode_std(statement)
        expected = make_statement(hmac_key, old_vault_id, successor, stated_at)
    except (Base64Error, StatementError):
        return False
    return hmac.compare_digest(given, b64decode_std(expected))
