"""docs/threat-model.md stays in step with the product (issue 31): every relay route and
every command of both CLIs is named in its index, every test it cites exists, and every
surface row cites at least one test."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

from engram_sync.client._cli.main import app as client_cli
from engram_sync.relay.cli.main import app as relay_cli
from engram_sync.relay.services.config import RelayConfig
from engram_sync.relay.serving.app import create_app

ROOT = Path(__file__).resolve().parent.parent
THREAT_MODEL = ROOT / "docs" / "threat-model.md"
# Litestar's OpenAPI pages, one family: the index names it once as `GET /schema/*`.
SCHEMA_PREFIX = "/schema"
TEST_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")


def _text() -> str:
    return THREAT_MODEL.read_text(encoding="utf-8")


def relay_routes() -> set[str]:
    """`METHOD /path` of every route the relay serves, with parameter types taken out."""
    app = create_app(RelayConfig(database_url="postgresql://unused@127.0.0.1:1/none"))
    routes = set()
    for route in app.routes:
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        if path == SCHEMA_PREFIX or path.startswith(SCHEMA_PREFIX + "/"):
            path = SCHEMA_PREFIX + "/*"
        for method in getattr(route, "methods", ()) or ():
            if method not in {"HEAD", "OPTIONS"}:
                routes.add(f"{method} {path}")
    return routes


def _leaves(command: Any, words: list[str]) -> Iterator[str]:
    children = getattr(command, "commands", None)
    if children and getattr(command, "invoke_without_command", False) and len(words) > 1:
        yield " ".join(words)  # a group that is a command of its own (`conflicts`, `vaults`)
    if children:
        for name, child in children.items():
            yield from _leaves(child, [*words, name])
    else:
        yield " ".join(words)


def cli_commands() -> set[str]:
    return set(_leaves(typer.main.get_command(client_cli), ["engram-sync"])) | set(
        _leaves(typer.main.get_command(relay_cli), ["engram-relay"])
    )


def _index() -> str:
    return _text().split("## Index", 1)[1]


def test_the_enumeration_finds_the_routes_and_commands_it_checks() -> None:
    """Guards the guard: an enumeration that found nothing would pass every check below."""
    assert "POST /v1/vaults/{vault_id}/push" in relay_routes()
    assert len(relay_routes()) > 40
    assert {"engram-sync sync", "engram-sync import", "engram-relay vaults grant"} <= (
        cli_commands()
    )


@pytest.mark.parametrize("route", sorted(relay_routes()))
def test_every_relay_route_has_its_row(route: str) -> None:
    assert f"`{route}`" in _index(), f"{route} is not named in docs/threat-model.md's index"


@pytest.mark.parametrize("command", sorted(cli_commands()))
def test_every_command_has_its_row(command: str) -> None:
    assert f"`{command}`" in _index(), f"{command} is not named in docs/threat-model.md's index"


def test_the_index_names_nothing_that_is_gone() -> None:
    named = set(re.findall(r"`((?:GET|POST|PUT|DELETE|PATCH) /[^`]*)`", _index()))
    named |= set(re.findall(r"`(engram-(?:sync|relay) [^`]*)`", _index()))
    stale = named - relay_routes() - cli_commands()
    assert not stale, f"docs/threat-model.md names routes or commands that do not exist: {stale}"


def test_every_cited_test_exists() -> None:
    cited = TEST_REFERENCE.findall(_text())
    assert cited
    for path, name in cited:
        source = ROOT / path
        assert source.is_file(), f"docs/threat-model.md cites {path}, which does not exist"
        if name:
            assert re.search(rf"^(?:async )?def {name}\(", source.read_text(), re.M), (
                f"docs/threat-model.md cites {path}::{name}, which does not exist"
            )


def test_every_surface_row_cites_a_test() -> None:
    surfaces = _text().split("## Surfaces", 1)[1].split("### Next surfaces", 1)[0]
    rows = [
        line
        for line in surfaces.splitlines()
        if line.startswith("| ") and not line.startswith("| actor") and "---" not in line
    ]
    assert len(rows) > 20
    for row in rows:
        tests_cell = row.rstrip(" |").rsplit("|", 1)[1]
        assert TEST_REFERENCE.search(tests_cell), f"a threat-model row cites no test: {row}"
