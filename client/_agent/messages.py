"""The agent's protocol: one request and one reply per connection, each a msgspec JSON
message behind a 4-byte big-endian length (docs/agent.md "Protocol").

Keys travel as lowercase hex: the SQLCipher key string of VAULT.md §2 and the two sync
keys of PROTOCOL §2 (None for a machine-key vault, which cannot sync). A vault is named
by its resolved directory path.
"""

from __future__ import annotations

import socket
import struct
from typing import Final

import msgspec

MAX_MESSAGE: Final = 64 * 1024
_LENGTH: Final = struct.Struct(">I")


class ProtocolError(Exception):
    """A malformed, oversized or truncated message."""


class HeldKeys(msgspec.Struct, frozen=True):
    """What the agent keeps for one vault. `repr` never shows the keys."""

    db_key: str
    enc_key: str | None = None
    hmac_key: str | None = None

    def __repr__(self) -> str:
        return "HeldKeys(<redacted>)"


class Put(msgspec.Struct, tag="put", frozen=True):
    """Keep `keys` for `vault`; the agent's idle timeout becomes `idle_timeout_s`."""

    vault: str
    keys: HeldKeys
    idle_timeout_s: float


class Get(msgspec.Struct, tag="get", frozen=True):
    """The keys of `vault`, or `locked`."""

    vault: str


class Forget(msgspec.Struct, tag="forget", frozen=True):
    """Drop the keys of `vault`."""

    vault: str


class Stop(msgspec.Struct, tag="stop", frozen=True):
    """Forget everything and exit."""


class Status(msgspec.Struct, tag="status", frozen=True):
    """Which vaults are held and the idle timeout."""


Request = Put | Get | Forget | Stop | Status


class Reply(msgspec.Struct, frozen=True):
    """The one reply: `ok` false with `error` ("locked", "refused: ...") or the answer."""

    ok: bool
    error: str | None = None
    keys: HeldKeys | None = None
    vaults: list[str] = msgspec.field(default_factory=list)
    idle_timeout_s: float | None = None
    idle_left_s: float | None = None
    pid: int | None = None

    def __repr__(self) -> str:
        return f"Reply(ok={self.ok}, error={self.error!r}, vaults={self.vaults!r})"


_ENCODER: Final = msgspec.json.Encoder()
_REQUEST: Final = msgspec.json.Decoder(Request)
_REPLY: Final = msgspec.json.Decoder(Reply)


def send(sock: socket.socket, message: msgspec.Struct) -> None:
    """Write one length-prefixed message."""
    body = _ENCODER.encode(message)
    if len(body) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(body)} bytes is over {MAX_MESSAGE}")
    sock.sendall(_LENGTH.pack(len(body)) + body)


def _read_exact(sock: socket.socket, count: int) -> bytes:
    chunks: list[bytes] = []
    left = count
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ProtocolError("the connection closed in the middle of a message")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_body(sock: socket.socket) -> bytes:
    (length,) = _LENGTH.unpack(_read_exact(sock, _LENGTH.size))
    if length > MAX_MESSAGE:
        raise ProtocolError(f"message of {length} bytes is over {MAX_MESSAGE}")
    return _read_exact(sock, length)


def read_request(sock: socket.socket) -> Request:
    """Read one request (ProtocolError when it is not one)."""
    try:
        return _REQUEST.decode(_read_body(sock))
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"not an agent request: {exc}") from None
    except msgspec.DecodeError:
        raise ProtocolError("not an agent request: not JSON") from None


def read_reply(sock: socket.socket) -> Reply:
    """Read one reply (ProtocolError when it is not one)."""
    try:
        return _REPLY.decode(_read_body(sock))
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise ProtocolError("not an agent reply") from None
