"""What every `engram-sync` command shares: the consoles, the vault option, the
passphrase prompt, opening the session, JSON output, and the one-line error type."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

import typer
from rich.console import Console

from engram_sync.client._agent.unlocked import unlocked_session
from engram_sync.client._session import VaultSession
from engram_sync.client._vault.store import get_row, row_needs_push

if TYPE_CHECKING:
    from sqlite3 import Connection

    from engram_sync.shared_format.plaintext import MemoryPlaintext

DEFAULT_VAULT: Final = Path("~/.engram/vault")


def memory_summary(conn: Connection, memory: MemoryPlaintext) -> dict[str, Any]:
    """What `list` and `search` show of a memory (the fields of `list --json`), with whether
    the vault holds it as pushed."""
    row = get_row(conn, memory.id)
    return {
        "id": memory.id,
        "content": memory.content,
        "layer": memory.layer,
        "tags": memory.tags,
        "project": memory.project,
        "created_at": memory.created_at,
        "modified_at": memory.modified_at,
        "privacy_level": memory.privacy_level,  # docs/privacy.md
        "synced": row is not None and not row_needs_push(row),
    }


def console(
    *,
    stderr: bool = False,
    file: IO[str] | None = None,
    environ: Mapping[str, str] | None = None,
    width: int | None = None,
    height: int | None = None,
) -> Console:
    """The CLI's console for stdout (or stderr); the key agent builds the same one over a
    command's streams when it answers `list` or `search` itself (client._agent.reads)."""
    return Console(
        stderr=stderr,
        file=file,
        highlight=False,
        soft_wrap=True,
        width=width,
        height=height,
        _environ=environ,
    )


out = console()
err = console(stderr=True)


class CliError(Exception):
    """A failure reported as one line."""


class _Options:
    vault: Path = DEFAULT_VAULT


OPTIONS = _Options()


def ask_passphrase(confirm: bool = False) -> str:
    env = os.environ.get("ENGRAM_PASSPHRASE")
    if env:
        return env
    if not sys.stdin.isatty():
        raise CliError("no passphrase: set ENGRAM_PASSPHRASE or run in a terminal to be asked")
    value: str = typer.prompt("Vault passphrase", hide_input=True, confirmation_prompt=confirm)
    if not value:
        raise CliError("the passphrase must not be empty")
    return value


@contextmanager
def open_session(create: bool = False, use_agent: bool = True) -> Iterator[VaultSession]:
    """The vault session: from the key agent's keys when it holds this vault
    (`engram-sync unlock`, docs/agent.md), else with the passphrase (env or prompt)."""
    path = OPTIONS.vault
    if not create and not (path / "engrams.db").exists():
        raise CliError(f"no vault at {path}: run `engram-sync init` (or pass --vault DIR)")
    session = unlocked_session(path) if use_agent and not create else None
    if session is None:
        session = VaultSession.open(path, ask_passphrase(confirm=create), create=create)
    with session:
        yield session


def print_json(payload: Any, to: Console | None = None) -> None:
    """`payload` as indented JSON on `to` (default: stdout's console)."""
    (to or out).print_json(json.dumps(payload, ensure_ascii=False, sort_keys=True))
