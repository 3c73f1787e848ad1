"""Reading a relay's event stream in tests (PROTOCOL §15): one message at a time.

The lines come from httpx (`Response.iter_lines`, which splits on LF, CR and CRLF as
the Server-Sent Events format says); a blank line ends a message, a line starting with
`:` is a comment. Only the fields the relay sends are kept."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Message:
    """One message of the stream: an event, a `retry:` or a comment."""

    event: str | None = None
    data: str | None = None
    retry: int | None = None
    comment: str | None = None

    def json(self) -> Any:
        assert self.data is not None, self
        return json.loads(self.data)


def messages(response: httpx.Response) -> Iterator[Message]:
    """The stream's messages in order, until it ends."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line == "":
            if fields:
                retry = fields.get("retry")
                yield Message(
                    event=fields.get("event"),
                    data=fields.get("data"),
                    retry=int(retry) if retry is not None else None,
                    comment=fields.get("comment"),
                )
            fields = {}
            continue
        if line.startswith(":"):
            fields["comment"] = line[1:].strip()
            continue
        name, _, value = line.partition(":")
        fields[name] = value.removeprefix(" ")


def next_event(stream: Iterator[Message], *, skip_pings: bool = True) -> Message:
    """The next message that is not a ping (or the next one at all)."""
    for message in stream:
        if skip_pings and message.comment == "ping" and message.event is None:
            continue
        return message
    raise AssertionError("the stream ended")
