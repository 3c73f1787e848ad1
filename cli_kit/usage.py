"""Both command lines (`engram-sync`, `engram-relay`) as a person meets them: usage errors
in words (which option, what is expected; never an exception's class name), a bare command
printing its help, help without type placeholders, and `--version` (issue 17, "Polish").

Typer (0.29) carries its own copy of Click, so its usage errors are `typer.TyperException`
subclasses, not `click.ClickException`; both kinds are handled here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any, Final

import typer

#: A bare command (`engram-sync team`, `engram-relay keys`) prints its help and exits 0: asking
#: for help is not an error. Any other usage error exits 2 (Click's convention).
BARE_COMMAND_EXIT: Final = 0
USAGE_EXIT: Final = 2


def _is_usage_error(exc: BaseException) -> bool:
    if isinstance(exc, typer.TyperException):
        return True
    try:
        import click
    except ImportError:  # pragma: no cover - typer no longer needs click
        return False
    return isinstance(exc, click.ClickException)


def usage_exit(exc: BaseException, err: Any) -> int | None:
    """Print a usage error of typer/Click in one line on `err` (a rich console) and return
    the exit status; None when `exc` is not one."""
    if not _is_usage_error(exc):
        return None
    # Typer's and Click's class of the same name; matched by name, as there are two.
    if type(exc).__name__ == "NoArgsIsHelpError":
        # The error's message is the help, made when it was raised: typer's rich help
        # printed itself then and left "" (rendering it again printed it twice).
        text = str(getattr(exc, "format_message", lambda: "")())
        if text:
            typer.echo(text)
        return BARE_COMMAND_EXIT
    message = str(getattr(exc, "format_message", lambda: str(exc))())
    ctx = getattr(exc, "ctx", None)
    hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    err.print(f"error: {message}{hint}", markup=False, highlight=False)
    return int(getattr(exc, "exit_code", USAGE_EXIT) or USAGE_EXIT)


def _commands(command: Any) -> Iterator[Any]:
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from _commands(sub)


def plain_help(command: Any) -> Any:
    """`command` (and every subcommand) with help that shows no type placeholders: a flag
    shows nothing after its name, an option or argument its name in capitals (`--port PORT`,
    `VAULT`), unless it has a metavar of its own. Returns `command`."""
    for cmd in _commands(command):
        ctx = typer.Context(cmd, info_name=cmd.name)
        help_option = cmd.get_help_option(ctx)
        params = [*cmd.params, *([help_option] if help_option is not None else [])]
        for param in params:
            if isinstance(param, typer.core.TyperArgument):
                # an argument's name is its placeholder already (`TEXT`): no `<str>` beside it
                param.display_type_rich = _no_type  # type: ignore[method-assign]
            if param.metavar is not None:
                continue
            if getattr(param, "is_flag", False) or getattr(param, "count", False):
                param.metavar = ""
            else:
                param.metavar = (param.name or "value").upper()
    return command


def _no_type(ctx: Any) -> None:
    return None


def version_callback(prog: str, version: str) -> Any:
    """A `--version` option callback printing `prog version` and exiting 0."""

    def show(value: bool) -> None:
        if value:
            typer.echo(f"{prog} {version}")
            raise typer.Exit(0)

    return show


def version_option(prog: str, version: str) -> Any:
    """The root callback's `--version` option: eager, prints `prog version`, exits 0."""
    return typer.Option(
        "--version",
        help="Show the version and exit.",
        is_eager=True,
        callback=version_callback(prog, version),
    )


def debug_option() -> Any:
    """The root callback's `--debug` option, declared for the help: `run` reads it from
    argv before parsing, so it works after a command too."""
    return typer.Option("--debug", help="Show the full traceback of an error (any position).")


def run(app: typer.Typer, prog: str, err: Any, report: Callable[[Exception], int]) -> None:
    """A command line's entry point: the command's own exit code; `typer.Exit` as asked;
    an abort (Ctrl-C) 130; a usage error in words (exit 2, with or without `--debug`: its
    traceback is the option parser's, not ours); any other error `--debug`'s traceback,
    else `report(exc)`'s one line and exit code."""
    debug = "--debug" in sys.argv
    if debug:
        sys.argv.remove("--debug")
    try:
        command = plain_help(typer.main.get_command(app))
        code = command.main(prog_name=prog, standalone_mode=False)  # typer.Exit(n) returns n
        if isinstance(code, int) and code:
            sys.exit(code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err.print("aborted")
        sys.exit(130)
    except Exception as exc:
        usage = usage_exit(exc, err)
        if usage is not None:
            sys.exit(usage)
        if debug:
            raise
        sys.exit(report(exc))
