"""What `list` and `search` show and how they print it: the one rendering code that the CLI
(client._cli.main, client._cli.search) and the key agent answering those commands itself
(client._agent.reads, docs/agent.md "Read commands") both run, so the two print the same
bytes. It reads the vault (client._vault) and writes to the consoles it is given; it knows
nothing of sessions, the agent or the command line.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import IO, Any, Final

import msgspec
from rich.console import Console

from ._vault.conflicts import Conflict
from ._vault.search import SearchFilters, search_ids
from ._vault.summaries import all_summaries, summaries_of

LAYERS: Final = ("episodic", "semantic", "imagined")
_MODE_NOTE: Final = {
    "any": "no memory has every word; these have some of them",
    "substring": "searched the text for the query as written (no word the index can match)",
}


class CliError(Exception):
    """A failure reported as one line."""


def console(
    *,
    stderr: bool = False,
    file: IO[str] | None = None,
    environ: Mapping[str, str] | None = None,
    width: int | None = None,
    height: int | None = None,
) -> Console:
    """The CLI's console for stdout (or stderr); the key agent builds the same one over a
    command's streams when it answers `list` or `search` itself (client._agent.reads)."""
    return Console(
        stderr=stderr,
        file=file,
        highlight=False,
        soft_wrap=True,
        width=width,
        height=height,
        _environ=environ,
    )


def print_json(payload: Any, to: Console) -> None:
    """`payload` as indented JSON (2 spaces, keys sorted, UTF-8 as it is) on `to`. Where
    there are no colours (a pipe, a file: a tool reading it), encoded by msgspec and written
    as it is, at what the bytes cost (issue 36: rich's rendering of 5,000 memories took
    seconds), the bytes rich printed there (tests/client/test_render.py); on a colour
    terminal rich colours it, as before."""
    if to.color_system is not None and not to.no_color:
        to.print_json(json.dumps(payload, ensure_ascii=False, sort_keys=True))
        return
    text = msgspec.json.format(msgspec.json.encode(payload, order="sorted"), indent=2)
    to.file.write(text.decode("utf-8") + "\n")
    to.file.flush()


def list_items(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """What `list` shows, oldest first: each memory's summary and whether it is synced
    (client._vault.summaries: one query, no plaintext built)."""
    return all_summaries(conn)


def render_list(items: list[dict[str, Any]], json_out: bool, out: Console, err: Console) -> None:
    """Print `list`'s output."""
    if json_out:
        print_json(items, out)
        return
    for item in items:
        first_line = item["content"].splitlines()[0] if item["content"] else ""
        if item["privacy_level"] == "strict_local":  # docs/privacy.md: never pushed
            mark = "  [strict_local]"
        else:
            mark = "" if item["synced"] else " *"
        line = f"{item['id']}  {item['modified_at'][:19]}  {first_line[:80]}{mark}"
        out.print(line, markup=False)  # user text, printed as it is
    if not items:
        err.print("no memories yet: `engram-sync add TEXT`")


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
    filters = SearchFilters(tuple(tags), project, layer)
    mode, ids = search_ids(conn, query, limit=limit, filters=filters)
    return mode, summaries_of(conn, ids)


def render_search(
    query: str, mode: str, items: list[dict[str, Any]], json_out: bool, out: Console, err: Console
) -> None:
    """Print `search`'s output."""
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


def conflict_line(c: Conflict) -> str:
    """One line of `engram-sync conflicts`: a local version that lost, or a pulled version
    kept out of a memory this device keeps local (PROTOCOL §8 strict_local)."""
    what = "deletion" if c.local_deleted else (c.local_content or "")[:70]
    version = f"{c.remote_device_id}@{c.remote_vector_clock}"
    how = f"{version} kept out (strict_local here)" if c.kept_out else f"lost to {version}"
    return f"#{c.id}  {c.memory_id}  {how}  {c.detected_at[:19]}  {what}"
