"""`engram-sync unlock` and `engram-sync lock`: the per-user key agent (issue 17,
docs/agent.md). Unlock derives the vault's keys once, after the passphrase opened it, and
hands them to the agent; every command then asks the agent before the passphrase."""

from __future__ import annotations

from typing import Annotated, Final

import typer

from .._agent import control
from .._agent.server import DEFAULT_IDLE_TIMEOUT_S
from .._agent.unlocked import derive_keys
from .support import OPTIONS, CliError, ask_passphrase, out
from .vault_registry import resolve_vault

MAX_IDLE_TIMEOUT_S: Final = 7 * 24 * 3600.0


def register(app: typer.Typer) -> None:
    """Add `unlock` and `lock` to the `engram-sync` app."""
    app.command("unlock")(unlock)
    app.command("lock")(lock)


def _duration(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def unlock(
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            help="Seconds without use after which the agent forgets every key and exits.",
            min=1,
            max=MAX_IDLE_TIMEOUT_S,
        ),
    ] = DEFAULT_IDLE_TIMEOUT_S,
) -> None:
    """Unlock the vault once: later commands take its keys from a per-user agent, without
    the passphrase, until `engram-sync lock` or the idle timeout."""
    path = OPTIONS.vault
    if not (path / "engrams.db").exists():
        raise CliError(f"no vault at {path}: run `engram-sync init` (or pass --vault DIR)")
    keys = derive_keys(path, ask_passphrase())  # a wrong passphrase ends here, nothing kept
    try:
        control.start_agent(timeout)
    except OSError as exc:
        raise CliError(str(exc)) from None
    if not control.put(path, keys, timeout):
        raise CliError("the key agent did not take the keys; run `engram-sync unlock` again")
    out.print(
        f"unlocked {control.vault_name(path)}: commands use the key agent until "
        f"`engram-sync lock` or {_duration(timeout)} without use"
    )


def lock(
    vault: Annotated[
        str | None,
        typer.Option(
            "--vault",
            help="Forget only this vault (directory or name); default: end the agent.",
            metavar="DIR|NAME",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Lock: end the key agent (it forgets every key), or forget one vault with --vault."""
    if vault is not None:
        path = resolve_vault(vault)
        if control.forget(path):
            out.print(f"locked {control.vault_name(path)}")
        else:
            out.print(f"the key agent does not hold {control.vault_name(path)}")
        return
    if control.stop():
        out.print("locked: the key agent forgot every key and exited")
    else:
        out.print("no key agent is running")
