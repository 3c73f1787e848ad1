"""A bounded Server-Sent Events parser for the live change feed (PROTOCOL §15).

The relay is untrusted, so every byte of the stream is hostile input: a line longer than
`max_line` bytes or an event whose data passes `max_event` bytes raises `SseTooLargeError`
(the caller drops the stream) instead of being buffered, and text that is not UTF-8 is
replaced, never raised. Fields follow the WHATWG event-stream rules: lines end with CRLF,
LF or CR; `:` starts a comment; `event`, `data` and `retry` are kept (`id` is read and
ignored: the device's own cursor is the resume point, never the relay's event id); a blank
line dispatches the event gathered so far.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MAX_LINE_BYTES: Final = 1024
MAX_EVENT_BYTES: Final = 4096


class SseTooLargeError(ValueError):
    """A line or an event passed its bound: the stream is not an honest feed."""


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event: its type (`message` when unnamed) and data."""

    event: str
    data: str


@dataclass(frozen=True)
class SseRetry:
    """A `retry:` field: the reconnection delay the relay asks for, in milliseconds."""

    millis: int


@dataclass(frozen=True)
class SseComment:
    """A comment line (`: ping`): the stream is alive."""


SseItem = SseEvent | SseRetry | SseComment


class SseParser:
    """Feed it bytes as they arrive; it returns the items those bytes completed."""

    def __init__(self, *, max_line: int = MAX_LINE_BYTES, max_event: int = MAX_EVENT_BYTES):
        self.max_line = max_line
        self.max_event = max_event
        self._line = bytearray()
        self._after_cr = False
        self._event = ""
        self._data: list[str] = []
        self._data_bytes = 0

    def feed(self, chunk: bytes) -> list[SseItem]:
        items: list[SseItem] = []
        start = 0
        for index, byte in enumerate(chunk):
            if byte not in (0x0A, 0x0D):
                continue
            if self._after_cr and byte == 0x0A and index == start:
                self._after_cr = False  # the LF of a CRLF split from its CR
                start = index + 1
                continue
            self._append(chunk[start:index])
            self._line_done(items)
            self._after_cr = byte == 0x0D
            start = index + 1
        if start < len(chunk):
            self._after_cr = False
            self._append(chunk[start:])
        return items

    def _append(self, piece: bytes) -> None:
        if len(self._line) + len(piece) > self.max_line:
            raise SseTooLargeError(f"an event-stream line passed {self.max_line} bytes")
        self._line += piece

    def _line_done(self, items: list[SseItem]) -> None:
        line = self._line.decode("utf-8", errors="replace")
        self._line.clear()
        if not line:
            self._dispatch(items)
            return
        if line.startswith(":"):
            items.append(SseComment())
            return
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data_bytes += len(value.encode("utf-8")) + 1
            if self._data_bytes > self.max_event:
                raise SseTooLargeError(f"an event-stream event passed {self.max_event} bytes")
            self._data.append(value)
        elif name == "retry" and value.isascii() and value.isdigit() and len(value) <= 9:
            items.append(SseRetry(int(value)))
        # `id` and unknown fields are ignored (WHATWG; PROTOCOL §15 needs neither)

    def _dispatch(self, items: list[SseItem]) -> None:
        if self._data or self._event:
            items.append(SseEvent(self._event or "message", "\n".join(self._data)))
        self._event, self._data, self._data_bytes = "", [], 0
