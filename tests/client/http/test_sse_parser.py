"""The bounded event-stream parser of the live feed (PROTOCOL §15): WHATWG line and field
rules, and hostile input (long lines, big events, bad UTF-8) refused or made harmless."""

from __future__ import annotations

import pytest

from engram_sync.client._http.sse import (
    SseComment,
    SseEvent,
    SseParser,
    SseRetry,
    SseTooLargeError,
)

STREAM = b'retry: 2000\n\n: ping\n\nevent: change\ndata: {"cursor": 5}\n\n'
EXPECTED = [SseRetry(2000), SseComment(), SseEvent("change", '{"cursor": 5}')]


def test_the_relays_stream_parses_into_retry_ping_and_change() -> None:
    assert SseParser().feed(STREAM) == EXPECTED


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_any_split_of_the_bytes_gives_the_same_items(size: int) -> None:
    parser = SseParser()
    items = []
    for start in range(0, len(STREAM), size):
        items += parser.feed(STREAM[start : start + size])
    assert items == EXPECTED


@pytest.mark.parametrize("newline", [b"\r\n", b"\r", b"\n"])
def test_every_line_ending_is_a_line_ending(newline: bytes) -> None:
    stream = STREAM.replace(b"\n", newline)
    assert SseParser().feed(stream) == EXPECTED
    # a CRLF split between two reads is one line ending, not two (no empty event)
    parser = SseParser()
    items = []
    for byte in range(len(stream)):
        items += parser.feed(stream[byte : byte + 1])
    assert items == EXPECTED


def test_fields_follow_the_whatwg_rules() -> None:
    parser = SseParser()
    got = parser.feed(
        b"data: one\ndata:two\nid: 7\nunknown: x\n\n"  # two data lines, id ignored
        b"event: change\n\n"  # a named event without data is still an event
        b"retry: soon\nretry: -1\nretry: 99999999999\n\n"  # not a valid retry: ignored
        b"\n\n"  # blank lines alone dispatch nothing
    )
    assert got == [SseEvent("message", "one\ntwo"), SseEvent("change", "")]


def test_a_line_past_the_bound_is_refused_not_buffered() -> None:
    parser = SseParser(max_line=64)
    assert parser.feed(b"data: " + b"x" * 58 + b"\n\n") == [SseEvent("message", "x" * 58)]
    with pytest.raises(SseTooLargeError, match="line"):
        parser.feed(b"data: " + b"x" * 59)  # no newline yet: refused as it grows


def test_an_event_past_the_bound_is_refused() -> None:
    parser = SseParser(max_line=64, max_event=100)
    parser.feed(b"data: " + b"y" * 40 + b"\n" + b"data: " + b"y" * 40 + b"\n")
    with pytest.raises(SseTooLargeError, match="event"):
        parser.feed(b"data: " + b"y" * 40 + b"\n")


def test_bytes_that_are_not_utf8_are_replaced_not_raised() -> None:
    assert SseParser().feed(b"event: ch\xffange\ndata: \xfe\n\n") == [
        SseEvent("ch\ufffdange", "\ufffd")
    ]
