"""Asking the agent (every command) and starting it (`engram-sync unlock`).

A command connects with a short timeout; no socket, a refused or silent connection, a
malformed reply or a peer that is not this user all mean "no agent", and the command falls
back to the passphrase. The agent's uid is checked from this side too (SO_PEERCRED): keys
are sent to, and taken from, only a process of this user.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
from pathlib import Path
from typing import Final

from .messages import (
    Forget,
    Get,
    HeldKeys,
    ProtocolError,
    Put,
    Reply,
    Request,
    Status,
    Stop,
    read_reply,
    send,
)
from .paths import ensure_agent_dir, socket_path
from .peer import peer_allowed

CONNECT_TIMEOUT_S: Final = 0.5
START_TIMEOUT_S: Final = 15.0
AGENT_MODULE: Final = "engram_sync.client._agent"


class AgentStartError(OSError):
    """The agent process did not come up."""


def vault_name(vault_dir: Path) -> str:
    """How the agent names a vault: its resolved directory."""
    return str(vault_dir.expanduser().resolve())


def ask(request: Request, path: Path | None = None) -> Reply | None:
    """The agent's reply to `request`, or None when there is no usable agent."""
    target = path or socket_path()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect(str(target))
            if not peer_allowed(sock):
                return None
            send(sock, request)
            return read_reply(sock)
    except (OSError, ProtocolError):
        return None


def held_keys(vault_dir: Path) -> HeldKeys | None:
    """The keys the agent holds for `vault_dir`, None when locked or there is no agent."""
    reply = ask(Get(vault=vault_name(vault_dir)))
    return reply.keys if reply is not None and reply.ok else None


def put(vault_dir: Path, keys: HeldKeys, idle_timeout_s: float) -> bool:
    """Hand the keys of `vault_dir` to the agent; True when it took them."""
    reply = ask(Put(vault=vault_name(vault_dir), keys=keys, idle_timeout_s=idle_timeout_s))
    return reply is not None and reply.ok


def forget(vault_dir: Path) -> bool:
    """Make the agent drop the keys of `vault_dir`; True when it held them."""
    reply = ask(Forget(vault=vault_name(vault_dir)))
    return reply is not None and reply.ok


def stop() -> bool:
    """End the agent; True when one was running."""
    reply = ask(Stop())
    return reply is not None and reply.ok


def status() -> Reply | None:
    """The held vaults and the idle timeout, None when there is no agent."""
    return ask(Status())


def agent_state(vault_dir: Path) -> str:
    """For `status`: `unlocked` (the agent holds this vault), `locked` or `not running`."""
    reply = status()
    if reply is None or not reply.ok:
        return "not running"
    return "unlocked" if vault_name(vault_dir) in reply.vaults else "locked"


def _agent_env() -> dict[str, str]:
    """The environment without ENGRAM_* (the passphrase must not live on in the agent's
    /proc environ)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}


def start_agent(idle_timeout_s: float) -> None:
    """Start the detached agent unless one is running; returns once it listens.

    AgentStartError when it does not say `ready` (or `running`) in time; AgentDirError,
    before anything starts, when its directory is not safe (someone else's, a link).
    """
    ensure_agent_dir()  # the agent checks it too, but only this process can say why
    process = subprocess.Popen(  # noqa: S603 - our own interpreter and module, fixed argv
        [sys.executable, "-m", AGENT_MODULE, "--timeout", repr(idle_timeout_s)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # no terminal signals; outlives this command
        cwd="/",
        env=_agent_env(),
    )
    assert process.stdout is not None
    with process.stdout:
        readable, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
        word = process.stdout.readline().decode("ascii", "replace").strip() if readable else ""
    if word not in ("ready", "running"):
        if process.poll() is None:
            process.kill()
        raise AgentStartError(
            f"the key agent did not start (socket {socket_path()}): "
            + (f"it said {word!r}" if word else "no answer")
        )
    if word == "running":
        process.wait(timeout=START_TIMEOUT_S)
