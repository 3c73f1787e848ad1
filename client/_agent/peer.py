"""Who is on the other end of a Unix socket: the peer's uid from SO_PEERCRED (Linux).

The agent answers only its own uid. Where SO_PEERCRED does not exist, no peer is trusted
(the agent refuses every connection): failing closed.
"""

from __future__ import annotations

import os
import socket
import struct

TYPE_CHECKING = False  # no `typing` at run time (client/__init__.py says why)
if TYPE_CHECKING:
    from typing import Final

_UCRED: Final = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process connected to `sock`, or None when the OS cannot say."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, option, _UCRED.size)
    except OSError:
        return None
    _pid, uid, _gid = _UCRED.unpack(raw)
    return int(uid)


def peer_allowed(sock: socket.socket, uid: int | None = None) -> bool:
    """Whether the peer of `sock` runs as `uid` (default: this process's uid)."""
    expected = os.getuid() if uid is None else uid
    found = peer_uid(sock)
    return found is not None and found == expected
