"""Where the web vault's bundle is: `engram_sync/web/` of the installed package (the top-level
`web/` folder of a checkout, linked like the others; docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path

from engram_sync.shared_format.web_bundle import INDEX, installed_bundle_dir


def bundle_dir() -> Path:
    """The folder holding index.html, js/ and vendor/ (FileNotFoundError if it is missing)."""
    folder = installed_bundle_dir()
    if not (folder / INDEX).is_file():
        raise FileNotFoundError(f"the web vault's bundle is missing from {folder}")
    return folder
