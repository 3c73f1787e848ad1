"""Where the web vault's bundle is: `engram_sync/web/` of the installed package (the top-level
`web/` folder of a checkout, linked like the others; docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import engram_sync

INDEX: Final = "index.html"


def bundle_dir() -> Path:
    """The folder holding index.html, js/ and vendor/ (FileNotFoundError if it is missing)."""
    folder = Path(engram_sync.__file__).resolve().parent / "web"
    if not (folder / INDEX).is_file():
        raise FileNotFoundError(f"the web vault's bundle is missing from {folder}")
    return folder
