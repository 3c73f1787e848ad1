"""RFC 3339 stamping and strict parsing (PROTOCOL §3, VAULT §3)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_sync.shared_format.timestamps import (
    _parse_by_rules,
    format_rfc3339,
    parse_rfc3339,
    parse_written_forms,
    utc_now_rfc3339,
)


def test_now_uses_plus_zero_offset() -> None:
    stamp = utc_now_rfc3339()
    assert stamp.endswith("+00:00")
    assert abs(parse_rfc3339(stamp) - datetime.now(UTC)) < timedelta(minutes=1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-08-30T12:00:00.123456789+00:00", datetime(2026, 8, 30, 12, 0, 0, 123456, UTC)),
        ("2026-08-30T12:00:00Z", datetime(2026, 8, 30, 12, tzinfo=UTC)),
        ("2026-08-30t14:00:00+02:00", datetime(2026, 8, 30, 12, tzinfo=UTC)),
        ("2026-08-30 12:00:00.5-01:00", datetime(2026, 8, 30, 13, 0, 0, 500000, UTC)),
    ],
)
def test_parses_rfc3339_as_instants(text: str, expected: datetime) -> None:
    assert parse_rfc3339(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "2026-08-30T12:00:00",  # no offset
        "2026-08-30",
        "20260830T120000Z",  # basic format is ISO 8601, not RFC 3339
        "2026-08-30T12:00Z",
        "2026-02-30T00:00:00Z",
        "2026-08-30T24:00:00Z",
        "2026-08-30T12:00:00+25:00",
        "2026-08-30T12:00:00.Z",
        "",
        "yesterday",
        "2026-08-30T12:00:00+00:00 ",
        "\u0662026-08-30T12:00:00Z",  # a non-ASCII digit
    ],
)
def test_rejects_non_rfc3339(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rfc3339(text)


@given(st.datetimes(timezones=st.just(UTC)))
def test_format_parse_round_trip(moment: datetime) -> None:
    text = format_rfc3339(moment)
    assert text.endswith("+00:00")
    assert parse_rfc3339(text) == moment


def test_format_refuses_naive() -> None:
    with pytest.raises(ValueError, match="naive"):
        format_rfc3339(datetime(2026, 1, 1))


def _outcome(parse: object, text: str) -> tuple[datetime, object] | str:
    try:
        moment = parse(text)  # type: ignore[operator]
    except ValueError as exc:
        return f"refused: {exc}"
    return moment, moment.utcoffset()


_DIGITS = st.text(alphabet="0123456789", min_size=1, max_size=1)


@given(
    st.datetimes(timezones=st.timezones()).map(lambda m: m.isoformat(timespec="microseconds")),
    st.lists(st.tuples(st.integers(0, 31), st.one_of(_DIGITS, st.sampled_from("a٣ :+-Z."))),
             max_size=3),
)  # fmt: skip
def test_the_fast_path_answers_as_the_rules(text: str, changes: list[tuple[int, str]]) -> None:
    """Issue 36: the form Engram writes goes through msgspec; wherever it does, the
    instant and offset are those of the rules (`_parse_by_rules`), and what the rules
    refuse is refused (with their message). Texts of that form, some with characters
    changed (out-of-range fields, offsets past :59, foreign digits, separators)."""
    for at, char in changes:
        if at < len(text):
            text = text[:at] + char + text[at + 1 :]
    assert _outcome(parse_rfc3339, text) == _outcome(_parse_by_rules, text)


@given(
    st.lists(
        st.tuples(
            st.datetimes(timezones=st.timezones()).map(
                lambda m: m.isoformat(timespec="microseconds")
            ),
            st.lists(st.tuples(st.integers(0, 31), st.one_of(_DIGITS, st.sampled_from("a٣ :+-Z."))),
                     max_size=2),
        ),
        min_size=1,
        max_size=4,
    )
)  # fmt: skip
def test_the_written_forms_at_once_are_each_text_s_or_none(
    cases: list[tuple[str, list[tuple[int, str]]]],
) -> None:
    """Issue 36: `parse_written_forms` gives `parse_rfc3339`'s instant and offset for every
    text when it answers, and None when any text is refused: never an instant for a text
    the rules refuse. None is also its answer where msgspec refuses what the rules accept
    (an offset of `+00:60`): then each text goes by `parse_rfc3339`."""
    texts = []
    for text, changes in cases:
        for at, char in changes:
            if at < len(text):
                text = text[:at] + char + text[at + 1 :]
        texts.append(text)
    at_once = parse_written_forms(texts)
    each = [_outcome(parse_rfc3339, t) for t in texts]
    if any(isinstance(e, str) for e in each):
        assert at_once is None
    elif at_once is not None:
        assert [(m, m.utcoffset()) for m in at_once] == each


def test_the_written_forms_at_once_take_the_common_case() -> None:
    texts = ["2026-12-05T14:39:18.496979+00:00", "2026-08-30T14:00:00.123456-02:30"]
    assert parse_written_forms(texts) == [parse_rfc3339(t) for t in texts]
    assert parse_written_forms([*texts, "2026-08-30T14:00:00+00:00"]) is None  # another form
    assert parse_written_forms([*texts, "2026-02-30T14:00:00.000000+00:00"]) is None
