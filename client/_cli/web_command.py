"""`engram-sync web`: the web vault served from the installed package on 127.0.0.1, with
`/v1/*` proxied to the vault's linked relay (issue 34, docs/web-vault.md).

It needs no passphrase and holds no key: the page asks for the API key, vault id and
passphrase and keeps its keys in the browser. Starlette and uvicorn (the `web` extra) are
imported in the command's body only (tests/client/cli/test_cli_imports.py), so a plain install
says what to install instead of failing on import."""

from __future__ import annotations

from typing import Annotated

import typer

from .._sync.config import load_sync_config
from .support import OPTIONS, CliError, err, out


def register(app: typer.Typer) -> None:
    """Add `web` to the `engram-sync` app."""
    app.command("web")(web_command)


def web_command(
    no_open: Annotated[
        bool, typer.Option("--no-open", help="Print the URL without opening a browser.")
    ] = False,
    port: Annotated[
        int,
        typer.Option("--port", help="Port on 127.0.0.1 (0: a free one).", min=0, max=65535),
    ] = 0,
) -> None:
    """Serve the web vault on 127.0.0.1 from this install; the page talks to the linked relay."""
    vault_dir = OPTIONS.vault.expanduser()
    if not (vault_dir / "engrams.db").exists():
        raise CliError(f"no vault at {vault_dir}: run `engram-sync init` (or pass --vault DIR)")
    config = load_sync_config(vault_dir)
    if not config.server_url:
        raise CliError("this vault is not linked to a relay: run `engram-sync link URL` first")
    try:
        from .._web.serve import run
    except ImportError as exc:
        raise CliError(
            f"`engram-sync web` needs the web extra ({exc.name} is missing): "
            "pip install 'engram-sync[web]'"
        ) from None
    try:
        run(
            config.server_url,
            config.vault_id,
            port=port,
            open_browser=not no_open,
            announce=lambda url: out.print(f"web vault at {url} (Ctrl-C to stop)", soft_wrap=True),
        )
    except (ValueError, FileNotFoundError, OSError) as exc:
        raise CliError(str(exc)) from None
    err.print("web vault stopped")
