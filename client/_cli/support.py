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


#: The passphrase a vault is re-keyed to (`rekey`, `rekey join`), for scripts.
NEW_PASSPHRASE_ENV: Final = "ENGRAM_NEW_PASSPHRASE"  # noqa: S105 - a variable name


def ask_secret(env: str, prompt: str, *, what: str, confirm: bool = False) -> str:
    """`env`'s value, else asked on the terminal (hidden; twice with `confirm`); never
    empty. Without a terminal, an error naming the variable to set."""
    value = os.environ.get(env)
    if value:
        return value
    if not sys.stdin.isatty():
        raise CliError(f"no {what}: set {env} or run in a terminal to be asked")
    asked: str = typer.prompt(prompt, hide_input=True, confirmation_prompt=confirm)
    if not asked:
        raise CliError(f"the {what} must not be empty")
    return asked


def ask_passphrase(confirm: bool = False) -> str:
    """The vault's passphrase: ENGRAM_PASSPHRASE, else a prompt."""
    return ask_secret("ENGRAM_PASSPHRASE", "Vault passphrase", what="passphrase", confirm=confirm)


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
