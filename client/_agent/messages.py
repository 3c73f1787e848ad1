"""The agent's protocol: one request and one reply per connection, each a msgspec JSON
message behind a 4-byte big-endian length (docs/agent.md "Protocol").

Keys travel as lowercase hex: the SQLCipher key string of VAULT.md §2 and the two sync
keys of PROTOCOL §2 (None for a machine-key vault, which cannot sync). A vault is named
by its resolved directory path.
"""

from __future__ import annotations

import socket
from typing import Final, Literal

import msgspec

from .frames import MAX_MESSAGE as MAX_MESSAGE
from .frames import ProtocolError as ProtocolError
from .frames import read_frame, send_frame

#: A read reply's output (it follows the reply, raw): larger is answered by the CLI itself.
MAX_OUTPUT: Final = 64 * 1024 * 1024
STDOUT: Final = 1
STDERR: Final = 2


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


class Terminal(msgspec.Struct, frozen=True):
    """What a command's output depends on besides the vault (docs/agent.md "Read
    commands"): whether each stream is a terminal, its encoding and error handler, the
    terminal size rich would read from the command's fds 0, 1, 2, and the environment
    variables rich reads (client._cli.fast.RICH_ENVIRON)."""

    stdout_isatty: bool
    stderr_isatty: bool
    stdout_encoding: str
    stdout_errors: str
    stderr_encoding: str
    stderr_errors: str
    size: tuple[int, int] | None
    environ: dict[str, str]


class Read(msgspec.Struct, tag="read", frozen=True):
    """Run `list` or `search` on `vault` with the keys held for it and return the output
    (client._cli.fast). `limit` None is search's default."""

    vault: str
    command: Literal["list", "search"]
    terminal: Terminal
    json_out: bool = False
    query: str = ""
    tags: list[str] = msgspec.field(default_factory=list)
    project: str | None = None
    layer: str | None = None
    limit: int | None = None


Request = Put | Get | Forget | Stop | Status | Read


class Reply(msgspec.Struct, frozen=True):
    """The one reply: `ok` false with `error` ("locked", "refused: ...") or the answer."""

    ok: bool
    error: str | None = None
    keys: HeldKeys | None = None
    vaults: list[str] = msgspec.field(default_factory=list)
    idle_timeout_s: float | None = None
    idle_left_s: float | None = None
    pid: int | None = None
    exit_code: int | None = None
    #: A read's output: (STDOUT or STDERR, byte count) in the order written; the bytes
    #: follow this reply on the connection, raw.
    chunks: list[tuple[int, int]] = msgspec.field(default_factory=list)

    def __repr__(self) -> str:
        return f"Reply(ok={self.ok}, error={self.error!r}, vaults={self.vaults!r})"


_ENCODER: Final = msgspec.json.Encoder()
_REQUEST: Final = msgspec.json.Decoder(Request)
_REPLY: Final = msgspec.json.Decoder(Reply)


def send(sock: socket.socket, message: msgspec.Struct) -> None:
    """Write one length-prefixed message."""
    send_frame(sock, _ENCODER.encode(message))


def read_request(sock: socket.socket) -> Request:
    """Read one request (ProtocolError when it is not one)."""
    try:
        return _REQUEST.decode(read_frame(sock))
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"not an agent request: {exc}") from None
    except msgspec.DecodeError:
        raise ProtocolError("not an agent request: not JSON") from None


def read_reply(sock: socket.socket) -> Reply:
    """Read one reply (ProtocolError when it is not one)."""
    try:
        return _REPLY.decode(read_frame(sock))
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise ProtocolError("not an agent reply") from None
