"""Timestamps as the vault stores them (VAULT §3: RFC 3339 with a `+00:00` offset)."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_now_rfc3339() -> str:
    """Now in UTC as `YYYY-MM-DDTHH:MM:SS.ffffff+00:00`.

    This is `datetime.now(timezone.utc).isoformat()` with the fraction always
    written (six digits), so every value this code stamps into `modified_at`
    has one fixed-width form and text comparison orders them like instants.
    """
    # VAULT §3: one canonical form for every modified_at written locally.
    return datetime.now(UTC).isoformat(timespec="microseconds")
