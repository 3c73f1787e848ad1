"""The vendored hash-wasm build (web/vendor, docs/web-vault.md "Vendored code"): every file
is the one the manifest names, byte for byte (SHA-256), and nothing else is in the folder."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENDOR = ROOT / "web" / "vendor"


def _manifest() -> dict[str, dict[str, str]]:
    data = json.loads((VENDOR / "manifest.json").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_every_vendored_file_matches_its_recorded_sha256() -> None:
    for name, entry in _manifest().items():
        digest = hashlib.sha256((VENDOR / name).read_bytes()).hexdigest()
        assert digest == entry["sha256"], f"web/vendor/{name} differs from the manifest"
        assert entry["package"] == "hash-wasm"
        assert entry["version"] == "4.13.0"


def test_the_vendor_folder_holds_only_the_manifest_and_what_it_lists() -> None:
    present = {p.name for p in VENDOR.iterdir()}
    assert present == {"manifest.json", *_manifest()}


def test_the_licence_ships_with_the_code() -> None:
    licence = (VENDOR / "hash-wasm-LICENSE").read_text(encoding="utf-8")
    assert "MIT License" in licence
    assert "Dani Biró" in licence
