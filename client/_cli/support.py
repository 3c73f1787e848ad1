"""What every `engram-sync` command shares: the consoles, the vault option, the
passphrase prompt, opening the session, JSON output, and the one-line error type."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import typer
from rich.console import Console

from .. import _render as render
from .._agent.unlocked import unlocked_session
from .._render import CliError as CliError  # raised by every command
from .._render import console
from .._session import VaultSession

DEFAULT_VAULT: Final = Path("~/.engram/vault")


out = console()
err = console(stderr=True)


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
    render.print_json(payload, to or out)
