"""The agent protocol's framing: a 4-byte big-endian length, then that many bytes
(docs/agent.md "Protocol"). Standard library only, so the `engram-sync` fast path
(client._cli.fast) can frame a request without importing msgspec."""

from __future__ import annotations

import socket
import struct

MAX_MESSAGE = 64 * 1024
_LENGTH = struct.Struct(">I")


class ProtocolError(Exception):
    """A malformed, oversized or truncated message."""


def send_frame(sock: socket.socket, body: bytes) -> None:
    """Write one length-prefixed message of at most MAX_MESSAGE bytes."""
    if len(body) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(body)} bytes is over {MAX_MESSAGE}")
    sock.sendall(_LENGTH.pack(len(body)) + body)


def read_exact(sock: socket.socket, count: int) -> bytes:
    """Exactly `count` bytes (ProtocolError when the peer closes before)."""
    chunks: list[bytes] = []
    left = count
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ProtocolError("the connection closed in the middle of a message")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket) -> bytes:
    """The body of one length-prefixed message (ProtocolError when it is over MAX_MESSAGE)."""
    (length,) = _LENGTH.unpack(read_exact(sock, _LENGTH.size))
    if length > MAX_MESSAGE:
        raise ProtocolError(f"message of {length} bytes is over {MAX_MESSAGE}")
    return read_exact(sock, length)
