"""Timestamps from requests, checked to fit the database (PROTOCOL §6 step 1, §7).

`parse_rfc3339` reads any RFC 3339 text Python can hold: years 0001-9999 with any
offset. An instant whose UTC time falls outside 0001-01-01..9999-12-31 (e.g.
`0001-01-01T00:00:00+14:00`, `9999-12-31T23:59:59-14:00`) cannot be sent to
PostgreSQL: asyncpg converts every timestamptz to UTC first, and overflows. Such a
value is bad input, so it gets a 400 naming the field, not the database's error.
"""

from __future__ import annotations

from datetime import UTC, datetime

from engram_sync.shared_format.timestamps import parse_rfc3339, parse_written_forms

RANGE_NOTE = "0001-01-01T00:00:00+00:00 to 9999-12-31T23:59:59.999999+00:00"


def parse_storable(text: str) -> datetime:
    """An RFC 3339 timestamp the database can store; ValueError naming the problem."""
    instant = parse_rfc3339(text)
    try:
        instant.astimezone(UTC)
    except OverflowError:
        raise ValueError(
            f"{text[:64]!r} is out of range: in UTC it must lie within {RANGE_NOTE}"
        ) from None
    return instant


def parse_storable_all(texts: list[str]) -> list[datetime] | None:
    """`parse_storable` of every text at once (issue 36), when each is in the form Engram
    writes and of a year from 0002 to 9998 (less than a day from UTC, such an instant cannot
    leave the range); None otherwise: then `parse_storable` each, which names the problem."""
    if not all("0001" < t[:4] < "9999" for t in texts):
        return None
    return parse_written_forms(texts)
