"""The vault's timestamp form (VAULT §3)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from engram_sync.shared_format.vault import utc_now_rfc3339

FORM = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}\+00:00")


def test_form_and_value() -> None:
    before = datetime.now(UTC)
    stamp = utc_now_rfc3339()
    after = datetime.now(UTC)
    assert FORM.fullmatch(stamp), stamp
    parsed = datetime.fromisoformat(stamp)
    assert parsed.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= parsed <= after + timedelta(seconds=1)


def test_fixed_width_even_on_a_whole_second() -> None:
    # isoformat() alone drops the fraction when microsecond == 0; the vault form never does.
    stamps = {utc_now_rfc3339() for _ in range(200)}
    assert all(len(stamp) == len("2026-01-01T00:00:00.000000+00:00") for stamp in stamps)


def test_text_order_is_time_order() -> None:
    first = utc_now_rfc3339()
    second = utc_now_rfc3339()
    assert first <= second
