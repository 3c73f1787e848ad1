"""The `engram-sync` entry point: `list` and `search` answered by the key agent, else the CLI.

With an agent holding the vault's keys (`engram-sync unlock`, docs/agent.md "Read
commands"), `list` and `search` need neither the CLI's imports (typer, rich, pydantic) nor
a vault open of their own (SQLCipher's key derivation on every open): the agent keeps the
vault open and runs the CLI's own code for them. This module looks at the command line
before anything else is imported (standard library only: no typer, rich, httpx, sqlcipher3,
not even msgspec), and for a `list` or `search` it fully understands it sends the agent the
parsed options, the resolved vault directory and what the output depends on (whether
stdout and stderr are terminals, their encodings, the terminal size, the environment
variables rich reads), then writes the agent's bytes to stdout and stderr and exits with
its status. Anything else, and every failure (no agent, a stale socket, a vault the agent
does not hold, a refusal, a malformed or slow reply, an error of the command itself),
runs the normal CLI (client._cli.main.main), which prints the same output or the error.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from .._agent.frames import ProtocolError, read_exact, read_frame, send_frame
from .._agent.paths import socket_path
from .._agent.peer import peer_allowed

CONNECT_TIMEOUT_S = 0.5
REPLY_TIMEOUT_S = 10.0  # the agent answers in milliseconds; a wedged one is left behind
MAX_OUTPUT = 64 * 1024 * 1024  # client._agent.messages.MAX_OUTPUT
DEFAULT_VAULT = "~/.engram/vault"  # client._cli.support.DEFAULT_VAULT
REGISTRY = ("engram-sync", "vaults.json")  # client._cli.vault_registry.registry_path
#: The environment variables rich 15's Console reads (tests/client/agent/test_agent_reads.py
#: checks the list against rich's source).
RICH_ENVIRON = (
    "COLUMNS",
    "LINES",
    "NO_COLOR",
    "FORCE_COLOR",
    "TTY_COMPATIBLE",
    "TTY_INTERACTIVE",
    "TERM",
    "COLORTERM",
    "JUPYTER_COLUMNS",
    "JUPYTER_LINES",
)
_SEARCH_VALUES = ("--tag", "--project", "--layer", "--limit")
_STREAMS = (1, 2)


def main() -> None:
    """`engram-sync`: the agent's answer when it gives one, else the CLI."""
    code = fast_path(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from .main import main as cli_main

    cli_main()


def fast_path(argv: list[str]) -> int | None:
    """Run `argv` through the agent: its exit status, or None for the normal CLI."""
    parsed = parse(argv)
    if parsed is None:
        return None
    vault, request = parsed
    directory = resolve_vault(vault)
    if directory is None or not (directory / "engrams.db").exists():
        return None
    terminal = _terminal()
    if terminal is None:
        return None
    request.update(type="read", vault=str(directory.expanduser().resolve()), terminal=terminal)
    answer = ask_agent(request)
    if answer is None:
        return None
    return write_output(*answer)


def _values(args: list[str]) -> tuple[str | None, list[str]] | None:
    """The group options (`--vault`, `--debug`) before the command, and the rest."""
    vault: str | None = None
    index = 0
    debug_seen = False
    while index < len(args) and args[index].startswith("-"):
        word = args[index]
        if word == "--debug" and not debug_seen:  # main() removes one; it changes no output
            debug_seen = True
            index += 1
        elif word == "--vault" and index + 1 < len(args):
            vault = args[index + 1]
            index += 2
        elif word.startswith("--vault="):
            vault = word.removeprefix("--vault=")
            index += 1
        else:
            return None  # --help, --version, anything else
        if vault is not None and (not vault or vault.startswith("-")):
            return None
    rest = args[index:]
    if not debug_seen and "--debug" in rest:
        rest = list(rest)
        rest.remove("--debug")
    return vault, rest


def parse(argv: list[str]) -> tuple[str | None, dict[str, object]] | None:
    """(the --vault value, the request's options) for a `list` or `search` with options
    exactly as the CLI takes them; None for anything else or any doubt."""
    found = _values(argv)
    if found is None:
        return None
    vault, rest = found
    if not rest or rest[0] not in ("list", "search"):
        return None
    if rest[0] == "list":
        if any(word != "--json" for word in rest[1:]):
            return None
        return vault, {"command": "list", "json_out": "--json" in rest[1:]}
    options = _search_options(rest[1:])
    return None if options is None else (vault, options)


def _search_options(args: list[str]) -> dict[str, object] | None:
    positional: list[str] = []
    tags: list[str] = []
    options: dict[str, object] = {"command": "search", "json_out": False}
    index, only_positional = 0, False
    while index < len(args):
        word = args[index]
        index += 1
        if only_positional or not word.startswith("-"):
            positional.append(word)
            continue
        if word == "--":
            only_positional = True
            continue
        if word == "--json":
            options["json_out"] = True
            continue
        name, equals, value = word.partition("=")
        if name not in _SEARCH_VALUES:
            return None
        if not equals:
            if index >= len(args):
                return None
            value = args[index]
            index += 1
        if value.startswith("-"):
            return None
        if name == "--tag":
            tags.append(value)
        elif name == "--limit":
            if not _plain_count(value):
                return None
            options["limit"] = int(value)
        else:
            options[name.removeprefix("--")] = value
    if len(positional) != 1 or positional[0] == "-":
        return None
    options.update(query=positional[0], tags=tags)
    return options


def _plain_count(value: str) -> bool:
    """1 to 999999999 written plainly (the CLI also takes `+5`, ` 5`, `05`: left to it)."""
    return value.isascii() and value.isdigit() and value[0] != "0" and len(value) <= 9


def resolve_vault(value: str | None) -> Path | None:
    """The vault directory as client._cli.vault_registry.resolve_vault finds it (ENGRAM_VAULT
    without --vault); None when in doubt (an empty value, an unreadable registry)."""
    if value is None:
        value = os.environ.get("ENGRAM_VAULT")
        if value == "":
            return None
    if value is None:
        return Path(DEFAULT_VAULT).expanduser()
    if "/" not in value and not value.startswith(("~", ".")):
        if sys.platform == "darwin":
            return None
        config = os.environ.get("XDG_CONFIG_HOME", os.path.expanduser("~/.config"))
        registry = Path(config, *REGISTRY)
        if registry.exists():
            try:
                data = json.loads(registry.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
            vaults = data.get("vaults") if isinstance(data, dict) else None
            if not isinstance(vaults, dict) or not all(isinstance(v, str) for v in vaults.values()):
                return None
            if value in vaults:
                return Path(vaults[value])
    return Path(value).expanduser()


def _terminal() -> dict[str, object] | None:
    """What the output depends on besides the vault (client._agent.messages.Terminal)."""
    out, err = sys.stdout, sys.stderr
    if out is None or err is None:
        return None
    try:
        isatty = (out.isatty(), err.isatty())
        streams = (out.encoding, out.errors, err.encoding, err.errors)
    except (AttributeError, ValueError):
        return None
    size = None
    for fd in (0, 1, 2):  # rich's order (Console.size)
        try:
            size = list(os.get_terminal_size(fd))
        except (AttributeError, ValueError, OSError):
            continue
        break
    return {
        "stdout_isatty": isatty[0],
        "stderr_isatty": isatty[1],
        "stdout_encoding": streams[0],
        "stdout_errors": streams[1],
        "stderr_encoding": streams[2],
        "stderr_errors": streams[3],
        "size": size,
        "environ": {k: os.environ[k] for k in RICH_ENVIRON if k in os.environ},
    }


def ask_agent(request: dict[str, object]) -> tuple[int, list[tuple[int, bytes]]] | None:
    """The agent's (exit status, output chunks) for `request`, None for the normal CLI."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect(str(socket_path()))
            if not peer_allowed(sock):  # a socket planted by someone else is never trusted
                return None
            sock.settimeout(REPLY_TIMEOUT_S)
            send_frame(sock, json.dumps(request).encode("ascii"))
            reply = json.loads(read_frame(sock))
            sizes = _chunks(reply)
            if sizes is None:
                return None
            payload = read_exact(sock, sum(size for _, size in sizes))
    except (OSError, ProtocolError, ValueError):
        return None
    chunks, offset = [], 0
    for stream, size in sizes:
        chunks.append((stream, payload[offset : offset + size]))
        offset += size
    return reply["exit_code"], chunks


def _chunks(reply: object) -> list[tuple[int, int]] | None:
    """The output's (stream, size) list of a well-formed answer, else None."""
    if not isinstance(reply, dict) or reply.get("ok") is not True:
        return None
    code, chunks = reply.get("exit_code"), reply.get("chunks")
    if type(code) is not int or not isinstance(chunks, list):
        return None
    sizes: list[tuple[int, int]] = []
    for chunk in chunks:
        if not (isinstance(chunk, list) and len(chunk) == 2 and chunk[0] in _STREAMS):
            return None
        size = chunk[1]
        if type(size) is not int or size < 0:
            return None
        sizes.append((chunk[0], size))
    if sum(size for _, size in sizes) > MAX_OUTPUT:
        return None
    return sizes


def write_output(code: int, chunks: list[tuple[int, bytes]]) -> int:
    """Write the agent's output in its order; `code`, or 1 when a stream fails (as the CLI
    reports an OSError: `error: ...`)."""
    try:
        for stream, data in chunks:
            target = sys.stdout if stream == 1 else sys.stderr
            target.flush()
            target.buffer.write(data)
            target.buffer.flush()
    except OSError as exc:
        try:
            sys.stderr.write(f"error: {exc}\n")
            sys.stderr.flush()
        except OSError:
            pass
        return 1
    return code
