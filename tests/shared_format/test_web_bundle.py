"""The web bundle as served and its manifest (shared_format/web_bundle.py): SRI inserted
in index.html, the import map allowed by its hash, the manifest's shape, and a garbled
manifest refused. Hashes are computed here, never written down: the bundle changes."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path

import pytest

from engram_sync.shared_format.web_bundle import (
    BundleCache,
    BundleError,
    ManifestError,
    bundle_from_folder,
    installed_bundle_dir,
    parse_manifest,
    read_bundle,
    served_bundle,
    sha256_hex,
    sri,
)

APP = b'import "./b.js";'
INDEX = b"""<!doctype html><html><head><link rel="stylesheet" href="style.css">
<script type="module" src="js/app.js"></script></head><body></body></html>"""


def small_bundle(folder: Path) -> Path:
    (folder / "js").mkdir(parents=True)
    (folder / "index.html").write_bytes(INDEX)
    (folder / "style.css").write_bytes(b"body{}")
    (folder / "js" / "app.js").write_bytes(APP)
    (folder / "js" / "b.js").write_bytes(b"export const b = 1;")
    return folder


def test_index_gets_integrity_and_an_import_map_of_every_module(tmp_path: Path) -> None:
    bundle = bundle_from_folder(small_bundle(tmp_path / "web"))
    index = bundle.files["index.html"].decode()
    assert f'src="js/app.js" integrity="{sri(APP)}"' in index
    assert f'href="style.css" integrity="{sri(b"body{}")}"' in index
    found = re.search(r'<script type="importmap">(.*?)</script>', index)
    assert found is not None
    assert json.loads(found.group(1)) == {
        "integrity": {"./js/app.js": sri(APP), "./js/b.js": sri(b"export const b = 1;")}
    }
    assert index.index("importmap") < index.index('src="js/app.js"')  # before any module
    digest = base64.b64encode(hashlib.sha256(found.group(1).encode()).digest()).decode()
    policy = bundle.content_security_policy
    assert f"script-src 'self' 'wasm-unsafe-eval' 'sha256-{digest}';" in policy
    assert "'unsafe-inline'" not in policy
    assert policy.startswith("default-src 'none'; ")
    assert policy.endswith("frame-ancestors 'none'")
    assert bundle.files["js/b.js"] == b"export const b = 1;"  # the rest as read


def test_the_manifest_lists_each_served_file(tmp_path: Path) -> None:
    bundle = bundle_from_folder(small_bundle(tmp_path / "web"))
    doc = json.loads(bundle.manifest_bytes())
    assert doc["format"] == "engram-web-bundle"
    assert doc["version"] == 1
    assert [f["path"] for f in doc["files"]] == ["index.html", "js/app.js", "js/b.js", "style.css"]
    for entry in doc["files"]:
        data = bundle.files[entry["path"]]
        assert entry == {"path": entry["path"], "size": len(data), "sha256": sha256_hex(data),
                         "integrity": sri(data)}  # fmt: skip
    assert parse_manifest(bundle.manifest_bytes()) == {
        p: sha256_hex(d) for p, d in bundle.files.items()
    }


def test_the_installed_bundle_is_served_and_listed() -> None:
    bundle = bundle_from_folder(installed_bundle_dir())
    assert {"index.html", "js/app.js", "vendor/hash-wasm-argon2.umd.min.js"} <= set(bundle.files)
    index = bundle.files["index.html"].decode()
    for path in bundle.files:
        if path.endswith(".js"):
            assert f'"./{path}":"{sri(bundle.files[path])}"' in index, path


def test_hidden_files_are_left_out_and_bad_names_refused(tmp_path: Path) -> None:
    folder = small_bundle(tmp_path / "web")
    (folder / ".git").mkdir()
    (folder / ".git" / "x").write_bytes(b"x")
    (folder / ".env").write_bytes(b"secret")
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "a.pyc").write_bytes(b"x")
    (folder / "js" / "link.js").symlink_to(folder / ".env")
    assert set(read_bundle(folder)) == {"index.html", "style.css", "js/app.js", "js/b.js"}
    (folder / "a b.js").write_bytes(b"x")
    with pytest.raises(BundleError, match="cannot serve"):
        read_bundle(folder)
    (folder / "a b.js").unlink()
    (folder / "manifest.json").write_bytes(b"{}")  # the served manifest's own path
    with pytest.raises(BundleError, match="cannot serve"):
        read_bundle(folder)
    (folder / "manifest.json").unlink()
    (folder / "index.html").unlink()
    with pytest.raises(BundleError, match=r"no index\.html"):
        read_bundle(folder)


def test_the_cache_sees_a_replaced_file(tmp_path: Path) -> None:
    folder = small_bundle(tmp_path / "web")
    cache = BundleCache(folder)
    first = cache.current()
    assert cache.current() is first
    (folder / "js" / "new.js").write_bytes(b"x")
    (folder / "js" / "new.js").replace(folder / "js" / "b.js")
    assert cache.current().files["js/b.js"] == b"x"


HEAD = b'{"format":"engram-web-bundle","version":1,"files":'
A64, B64 = b"a" * 64, b"b" * 64
GARBLED = (
    b"not json",
    b"[]",
    b'{"format":"other","version":1,"files":[]}',
    b'{"format":"engram-web-bundle","version":2,"files":[]}',
    HEAD + b"{}}",
    HEAD + b"[1]}",
    HEAD + b'[{"path":"../x","sha256":"' + A64 + b'"}]}',
    HEAD + b'[{"path":"x","sha256":"A"}]}',
    HEAD + b'[{"path":"x","sha256":"' + A64 + b'"},{"path":"x","sha256":"' + B64 + b'"}]}',
)  # fmt: skip


@pytest.mark.parametrize("data", GARBLED)
def test_a_garbled_manifest_is_refused(data: bytes) -> None:
    with pytest.raises(ManifestError):
        parse_manifest(data)


def test_index_without_script_or_head_is_refused() -> None:
    with pytest.raises(BundleError):
        served_bundle({"index.html": b"<p>no head</p>"})
