"""`engram-sync mcp`: the MCP server for AI tools over stdio (issue 33, docs/mcp.md).

The `mcp` package (the `mcp` extra) is imported in the command's body only, so no other
command pays for it (tests/client/test_cli_imports.py) and a plain install says what to
install instead of failing on import.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from .support import OPTIONS, CliError, err, out


def mcp(
    print_config: Annotated[
        str | None,
        typer.Option(
            "--print-config",
            help="Print the MCP settings for claude, cursor, codex or vscode, and exit.",
            metavar="CLIENT",
        ),
    ] = None,
) -> None:
    """Serve the vault to AI tools over MCP (stdio); keys from `engram-sync unlock`."""
    vault_dir = OPTIONS.vault.expanduser().resolve()
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
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith(("mcp", "pydantic")):
            raise
        raise CliError(
            "the MCP server needs the mcp extra: pip install 'engram-sync[mcp]'"
        ) from None
    if not (vault_dir / "engrams.db").exists():
        raise CliError(f"no vault at {vault_dir}: run `engram-sync init` (or pass --vault DIR)")
    run_stdio(vault_dir, os.environ.get("ENGRAM_PASSPHRASE"))


def register(app: typer.Typer) -> None:
    """Add `mcp` to the CLI."""
    app.command("mcp")(mcp)
