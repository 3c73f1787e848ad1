"""`engram-sync mcp`: the MCP server for AI tools over stdio or Streamable HTTP, syncing
live while it runs, and `engram-sync mcp token add|list|revoke` for the HTTP clients'
tokens (issue 33, docs/mcp.md).

The `mcp` package (the `mcp` extra) is imported in the server's branch only, so no other
command pays for it (tests/client/cli/test_cli_imports.py) and a plain install says what to
install instead of failing on import.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from .support import OPTIONS, CliError, err, out

mcp_app = typer.Typer(
    help="Serve the vault to AI tools over MCP; `token` manages the --http clients' tokens.",
    invoke_without_command=True,
)
token_app = typer.Typer(help="Bearer tokens of the clients of `engram-sync mcp --http`.")
mcp_app.add_typer(token_app, name="token")


def _vault_dir() -> Path:
    return OPTIONS.vault.expanduser().resolve()


def _existing_vault_dir() -> Path:
    vault_dir = _vault_dir()
    if not (vault_dir / "engrams.db").exists():
        raise CliError(f"no vault at {vault_dir}: run `engram-sync init` (or pass --vault DIR)")
    return vault_dir


@mcp_app.callback()
# long: the command's options are its signature (typer)
def mcp(
    ctx: typer.Context,
    print_config: Annotated[
        str | None,
        typer.Option(
            "--print-config",
            help="Print the MCP settings for claude, cursor, codex or vscode, and exit.",
            metavar="CLIENT",
        ),
    ] = None,
    http: Annotated[
        bool,
        typer.Option("--http", help="Serve Streamable HTTP on 127.0.0.1 (a token per client)."),
    ] = False,
    host: Annotated[
        str, typer.Option("--host", help="With --http: 127.0.0.1, the only address allowed.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", help="With --http: the port.", min=1, max=65535)
    ] = 8765,
    no_live: Annotated[
        bool,
        typer.Option("--no-live", help="Do not sync while serving (sync with `sync`/`watch`)."),
    ] = False,
) -> None:
    """Serve the vault to AI tools over MCP (stdio, or --http), syncing live while it runs;
    keys from `engram-sync unlock`."""
    if ctx.invoked_subcommand is not None:
        return
    vault_dir = _vault_dir()
    if print_config is not None:
        from .._mcp.client_config import (
            CLIENTS,
            WHERE,
            engram_sync_command,
            snippet,
        )

        if print_config not in CLIENTS:
            raise CliError(f"--print-config takes one of {', '.join(CLIENTS)}")
        err.print(f"# {WHERE[print_config]}", markup=False)
        out.print(snippet(print_config, vault_dir, engram_sync_command()), markup=False)
        return
    try:
        from .._mcp.server import run_stdio

        if http:
            from .._mcp.http import check_host, run_http
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith(("mcp", "pydantic", "uvicorn", "starlette")):
            raise
        raise CliError(
            "the MCP server needs the mcp extra: pip install 'engram-sync[mcp]'"
        ) from None
    if http:
        try:
            check_host(host)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    if not (vault_dir / "engrams.db").exists():
        raise CliError(f"no vault at {vault_dir}: run `engram-sync init` (or pass --vault DIR)")
    passphrase = os.environ.get("ENGRAM_PASSPHRASE")
    if not http:
        run_stdio(vault_dir, passphrase, live=not no_live)
        return
    from .._mcp.tokens import TokenError, TokenStore

    try:
        known = len(TokenStore(vault_dir))
    except (TokenError, ValueError) as exc:
        raise CliError(str(exc)) from None
    if not known:
        raise CliError("no client tokens yet: run `engram-sync mcp token add NAME` first")
    run_http(vault_dir, passphrase, host=host, port=port, live=not no_live)


@token_app.command("add")
def token_add(
    name: Annotated[str, typer.Argument(help="The client's name (e.g. cursor-laptop).")],
) -> None:
    """Make a token for client NAME and print it once (only its hash is kept)."""
    from .._mcp.tokens import TokenError, TokenStore

    try:
        token = TokenStore(_existing_vault_dir()).add(name)
    except (TokenError, ValueError, OSError) as exc:
        raise CliError(str(exc)) from None
    err.print(
        f"token for {name} (shown once; the client sends it as `Authorization: Bearer ...`):",
        markup=False,
    )
    out.print(token, markup=False)


@token_app.command("list")
def token_list() -> None:
    """The clients with a token, and when each was made (never the tokens)."""
    from .._mcp.tokens import TokenError, TokenStore

    try:
        found = TokenStore(_existing_vault_dir()).list()
    except (TokenError, ValueError, OSError) as exc:
        raise CliError(str(exc)) from None
    if not found:
        err.print("no tokens: `engram-sync mcp token add NAME` makes one")
    for info in found:
        out.print(f"{info.name}\t{info.created_at}", markup=False)


@token_app.command("revoke")
def token_revoke(
    name: Annotated[str, typer.Argument(help="The client whose token to refuse from now on.")],
) -> None:
    """Refuse client NAME's token from its next request on (a running server too)."""
    from .._mcp.tokens import TokenError, TokenStore

    try:
        TokenStore(_existing_vault_dir()).revoke(name)
    except (TokenError, ValueError, OSError) as exc:
        raise CliError(str(exc)) from None
    err.print(f"revoked {name}'s token", markup=False)


def register(app: typer.Typer) -> None:
    """Add `mcp` (and `mcp token ...`) to the CLI."""
    app.add_typer(mcp_app, name="mcp")
