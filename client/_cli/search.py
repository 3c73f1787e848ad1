"""`engram-sync search QUERY`: the vault's full-text index, as `Vault.search` reads it
(client._vault.search; docs/search.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from .._render import check_search, render_search, search_items
from .._vault.search import DEFAULT_LIMIT
from .support import err, open_session, out


def register(app: typer.Typer) -> None:
    """Add `search` to the `engram-sync` app."""
    app.command("search")(search_command)


def search_command(
    query: Annotated[str, typer.Argument(help="Words to find (all of them, else any).")],
    tag: Annotated[
        list[str] | None,
        typer.Option(
            "--tag", help="Only memories with this tag (repeatable: all of them).", metavar="TAG"
        ),
    ] = None,
    project: Annotated[
        str | None, typer.Option("--project", help="Only this project's memories.", metavar="P")
    ] = None,
    layer: Annotated[
        str | None,
        typer.Option(
            "--layer", help="Only this layer: episodic, semantic or imagined.", metavar="LAYER"
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", help="At most this many results.", min=1, metavar="N")
    ] = DEFAULT_LIMIT,
    json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """Search memories: best match first, then the most recently modified, then by id."""
    check_search(query, layer)
    with open_session() as session:
        mode, items = search_items(session.vault.conn, query, tag or [], project, layer, limit)
    render_search(query, mode, items, json_out, out, err)
