"""Options shared by every `engram-relay` command that reaches the database."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="PostgreSQL URL. Default: $ENGRAM_RELAY_DATABASE_URL, $DATABASE_URL, "
        "else an embedded PostgreSQL in the data dir.",
        show_default=False,
    ),
]
DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir", help="Relay data dir (embedded database, admin key).", show_default=False
    ),
]
