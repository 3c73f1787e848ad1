"""`engram-sync web`: the web vault served from the installed package on 127.0.0.1, with
`/v1/*` proxied to the vault's linked relay (issue 34, docs/web-vault.md).

It needs no passphrase and holds no key: the page asks for the API key, vault id and
passphrase and keeps its keys in the browser. Starlette and uvicorn (the `web` extra) are
imported in the command's body only (tests/client/cli/test_cli_imports.py), so a plain install
says what to install instead of failing on import."""

from __future__ import annotations

from typing import Annotated

import typer

from engram_sync import __version__

from .._sync.config import load_sync_config
from .support import OPTIONS, CliError, err, out

web_app = typer.Typer(
    help="Serve the web vault on 127.0.0.1 from this install; `verify` checks a relay's copy.",
    invoke_without_command=True,
)


def register(app: typer.Typer) -> None:
    """Add `web` and `web verify` to the `engram-sync` app."""
    web_app.callback()(web_command)
    web_app.command("verify")(verify_command)
    app.add_typer(web_app, name="web")


def web_command(
    ctx: typer.Context,
    no_open: Annotated[
        bool, typer.Option("--no-open", help="Print the URL without opening a browser.")
    ] = False,
    port: Annotated[
        int,
        typer.Option("--port", help="Port on 127.0.0.1 (0: a free one).", min=0, max=65535),
    ] = 0,
) -> None:
    """Serve the web vault on 127.0.0.1 from this install; the page talks to the linked relay."""
    if ctx.invoked_subcommand is not None:
        return
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


def verify_command(
    url: Annotated[str, typer.Argument(help="The relay's URL, or its /vault/.")],
) -> None:
    """Compare a relay's /vault/ with this install's web vault, file by file.

    One line and exit 0 for a match; every differing, missing or added file and exit 1
    otherwise; exit 2 when the relay cannot be read (docs/web-vault.md).
    """
    from engram_sync.shared_format.web_bundle import bundle_from_folder

    from .._web.bundle import bundle_dir
    from .._web.verify import findings, report, vault_url
    from .._web.verify_fetch import VerifyError, fetch

    local = bundle_from_folder(bundle_dir())
    try:
        root = vault_url(url)
        served = fetch(root, local.files)
    except (ValueError, VerifyError) as exc:
        err.print(f"error: {exc}", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    found = findings(local, served)
    for line in report(root, local, found, __version__):
        out.print(line, markup=False, soft_wrap=True, highlight=False)
    if found:
        raise typer.Exit(1)
