"""`engram-sync search QUERY`: the vault's full-text index, as `Vault.search` reads it
(client._vault.search; docs/search.md)."""

from __future__ import annotations

import sqlite3
from typing import Annotated, Any, Final

import typer
from rich.console import Console

from engram_sync.client._cli.support import (
    CliError,
    err,
    memory_summary,
    open_session,
    out,
    print_json,
)
from engram_sync.client._vault.search import DEFAULT_LIMIT, SearchFilters, search

LAYERS: Final = ("episodic", "semantic", "imagined")
_MODE_NOTE: Final = {
    "any": "no memory has every word; these have some of them",
    "substring": "searched the text for the query as written (no word the index can match)",
}


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


def check_search(query: str, layer: str | None) -> None:
    """CliError for a layer that does not exist or an empty query."""
    if layer is not None and layer not in LAYERS:
        raise CliError(f"--layer must be one of {', '.join(LAYERS)}, not {layer!r}")
    if not query.strip():
        raise CliError("the query is empty: give the words to search for")


def search_items(
    conn: sqlite3.Connection,
    query: str,
    tags: list[str],
    project: str | None,
    layer: str | None,
    limit: int,
) -> tuple[str, list[dict[str, Any]]]:
    """The search's mode and what it shows of each result (client._vault.search)."""
    result = search(conn, query, limit=limit, filters=SearchFilters(tuple(tags), project, layer))
    items = [memory_summary(conn, memory) for memory in result.memories]
    return result.mode, items


def render_search(
    query: str, mode: str, items: list[dict[str, Any]], json_out: bool, out: Console, err: Console
) -> None:
    """Print `search`'s output; the key agent runs this too (client._agent.reads)."""
    if json_out:
        print_json({"mode": mode, "results": items}, out)
        return
    if not items:
        err.print(f"no memory matches {query!r}", markup=False)
        return
    note = _MODE_NOTE.get(mode)
    if note:
        err.print(note)
    for item in items:
        first_line = item["content"].splitlines()[0] if item["content"] else ""
        mark = "  [strict_local]" if item["privacy_level"] == "strict_local" else ""
        line = f"{item['id']}  {item['modified_at'][:19]}  {first_line[:80]}{mark}"
        out.print(line, markup=False)
