"""RFC 3339 timestamps as the Engram format writes and reads them (PROTOCOL §3, VAULT §3).

Writers stamp `datetime.now(timezone.utc).isoformat()`-style text with a `+00:00`
offset (never `Z`). Readers parse strictly as RFC 3339 and compare instants,
never text, for anything that came from elsewhere.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import msgspec

# RFC 3339 §5.6 date-time: full-date "T" full-time, fraction optional, offset required.
_RFC3339 = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})[Tt ](?P<time>\d{2}:\d{2}:\d{2})"
    r"(?:\.(?P<frac>\d+))?(?P<offset>[Zz]|[+-]\d{2}:\d{2})",
    re.ASCII,
)


def utc_now_rfc3339() -> str:
    """Now in UTC as `YYYY-MM-DDTHH:MM:SS.ffffff+00:00` (the form Engram writes)."""
    return format_rfc3339(datetime.now(UTC))


def format_rfc3339(moment: datetime) -> str:
    """A datetime in UTC with a `+00:00` offset and microseconds (the canonical form)."""
    if moment.tzinfo is None:
        raise ValueError("naive datetime: an RFC 3339 timestamp needs an offset")
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def parse_rfc3339(text: str) -> datetime:
    """Parse an RFC 3339 date-time into an aware datetime.

    Fractions beyond microseconds are truncated (Python's resolution); raises
    ValueError naming the problem when the text is not RFC 3339.

    The form Engram writes (`format_rfc3339`: 32 characters, `T`, six fraction digits, a
    numeric offset) is parsed by msgspec, in C (issue 36: the relay parses every pushed
    blob's `created_at`); whatever msgspec refuses there, and every other form, goes by
    `_parse_by_rules`, which decides what is accepted. tests/shared_format/test_timestamps.py
    checks that both give the same instant and offset wherever msgspec accepts.
    """
    if _written_form(text):
        try:
            moment = msgspec.convert(text, datetime)
        except msgspec.ValidationError:
            pass
        else:
            if moment.tzinfo is not None:
                return moment
    return _parse_by_rules(text)


def _written_form(text: str) -> bool:
    """The shape of `format_rfc3339`'s text (32 characters, `T`, six fraction digits, a
    numeric offset): what msgspec accepts of it, it parses as `_parse_by_rules` would (it
    refuses some that the rules accept, an offset of `+00:60`: those go by the rules)."""
    return len(text) == 32 and text[10] == "T" and text[19] == "." and text[26] in "+-"


def parse_written_forms(texts: list[str]) -> list[datetime] | None:
    """`parse_rfc3339` of every text in one msgspec call (issue 36: each pushed blob's
    `created_at`), when every one is in the form Engram writes and msgspec reads it with
    its offset; None otherwise (then parse each: `parse_rfc3339` decides)."""
    if not all(map(_written_form, texts)):
        return None
    try:
        moments = msgspec.convert(texts, list[datetime])
    except msgspec.ValidationError:
        return None
    if any(m.tzinfo is None for m in moments):
        return None
    return moments


def _parse_by_rules(text: str) -> datetime:
    """`parse_rfc3339` by the RFC 3339 grammar above and `datetime.fromisoformat`."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise ValueError(f"not an RFC 3339 timestamp with an offset: {text[:64]!r}")
    frac = (match.group("frac") or "")[:6].ljust(6, "0")
    offset = match.group("offset")
    offset = "+00:00" if offset in ("Z", "z") else offset
    try:
        return datetime.fromisoformat(f"{match.group('date')}T{match.group('time')}.{frac}{offset}")
    except ValueError as exc:
        raise ValueError(f"invalid date or time in {text[:64]!r}: {exc}") from None
