"""The web vault's bundle as it is served, and its manifest (issue 34, docs/web-vault.md
"The manifest"): what the relay serves at `/vault/` and `engram-sync web` serves on 127.0.0.1,
and what `engram-sync web verify` compares them with. Pure and synchronous: reading the
bundle's folder is its only I/O.

Every file is served as it is installed except `index.html`, which gets Subresource
Integrity: an `integrity` attribute on each script and stylesheet it names, and an import map
(`<script type="importmap">`) whose `integrity` lists every module of the bundle, so Chromium
checks each module the page imports, statically or not. The import map is an inline script:
the Content-Security-Policy allows it by its SHA-256 and nothing else inline.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

INDEX: Final = "index.html"
#: `/vault/manifest.json`: the manifest's own path (no bundle file may take it).
MANIFEST_PATH: Final = "manifest.json"
MANIFEST_FORMAT: Final = "engram-web-bundle"
MANIFEST_VERSION: Final = 1
#: Bounds of a bundle (the installed one holds about 20 files, under 200 KB).
MAX_FILES: Final = 1000
MAX_FILE_BYTES: Final = 8 * 1024 * 1024
#: A bundle path: `/`-separated names of letters, digits, `.`, `_`, `-`, none starting with
#: a dot (no `..`, no hidden file) and none empty.
_PATH: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*(?:/[A-Za-z0-9_-][A-Za-z0-9._-]*)*")
_SCRIPT_OR_STYLE: Final = re.compile(
    r'<(script\b[^>]*?\bsrc|link\b[^>]*?\brel="stylesheet"[^>]*?\bhref)="([^"]+)"([^>]*)>'
)
_MODULE_SUFFIXES: Final = (".js", ".mjs")
CONTENT_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".wasm": "application/wasm",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
_CSP_DIRECTIVES: Final = (
    "default-src 'none'",
    "script-src 'self' 'wasm-unsafe-eval'",
    "worker-src 'self'",
    "connect-src 'self'",
    "style-src 'self'",
    "img-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
)


class BundleError(ValueError):
    """A bundle folder that cannot be served (too many or too large files, a bad name)."""


@dataclass(frozen=True)
class ServedBundle:
    """Each file's bytes as served (index.html with SRI) and the policy that goes with them."""

    files: Mapping[str, bytes]
    import_map_sha256: str  # base64, as the CSP source 'sha256-...' names it

    @property
    def content_security_policy(self) -> str:
        """The page's CSP: the import map allowed by its hash, no other inline script."""
        return content_security_policy(self.import_map_sha256)

    def manifest(self) -> dict[str, object]:
        """The manifest (docs/web-vault.md "The manifest"): every served file's path, size,
        SHA-256 (hex) and SRI string, sorted by path."""
        return {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "files": [
                {
                    "path": path,
                    "size": len(data),
                    "sha256": sha256_hex(data),
                    "integrity": sri(data),
                }
                for path, data in sorted(self.files.items())
            ],
        }

    def manifest_bytes(self) -> bytes:
        """The manifest as served: sorted compact JSON, UTF-8."""
        return json.dumps(self.manifest(), sort_keys=True, separators=(",", ":")).encode()


def installed_bundle_dir() -> Path:
    """`engram_sync/web/` of the installed package (the checkout's `web/`, linked)."""
    return Path(str(importlib.resources.files("engram_sync") / "web"))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sri(data: bytes) -> str:
    """The Subresource Integrity string of `data`: `sha256-` and the base64 digest."""
    return "sha256-" + base64.b64encode(hashlib.sha256(data).digest()).decode()


def content_security_policy(import_map_sha256: str | None) -> str:
    """The CSP of every answer under the bundle: default-src 'none', scripts from this origin
    and WebAssembly compilation (Argon2id), the one inline import map by its hash (None: no
    inline script at all, for an answer that is not the page)."""
    script = _CSP_DIRECTIVES[1]
    if import_map_sha256 is not None:
        script += f" 'sha256-{import_map_sha256}'"
    return "; ".join((_CSP_DIRECTIVES[0], script, *_CSP_DIRECTIVES[2:]))


def content_type(path: str) -> str:
    return CONTENT_TYPES.get(Path(path).suffix.lower(), "text/plain; charset=utf-8")


def is_bundle_path(path: str) -> bool:
    """Whether `path` is a name a bundle file may have (no dot segment, no empty one)."""
    return len(path) <= 255 and _PATH.fullmatch(path) is not None


def read_bundle(folder: Path) -> dict[str, bytes]:
    """Every regular file under `folder` by its `/`-separated relative path; hidden files
    and folders, `__pycache__` and symbolic links inside are left out. BundleError beyond
    the bounds or without index.html."""
    files: dict[str, bytes] = {}
    for item in sorted(folder.rglob("*")):
        relative = item.relative_to(folder).as_posix()
        if item.is_symlink() or not item.is_file() or "__pycache__" in relative:
            continue
        if any(part.startswith(".") for part in relative.split("/")):
            continue
        if not is_bundle_path(relative) or relative == MANIFEST_PATH:
            raise BundleError(f"the web bundle holds a file it cannot serve: {relative[:200]!r}")
        if len(files) >= MAX_FILES or item.stat().st_size > MAX_FILE_BYTES:
            raise BundleError(f"the web bundle at {folder} is beyond its bounds")
        files[relative] = item.read_bytes()
    if INDEX not in files:
        raise BundleError(f"the web bundle at {folder} has no {INDEX}")
    return files


def import_map(files: Mapping[str, bytes]) -> str:
    """The import map's text: the SRI string of every module of the bundle, by URL
    relative to the page (so it holds at `/` and at `/vault/` alike)."""
    integrity = {f"./{p}": sri(d) for p, d in sorted(files.items()) if p.endswith(_MODULE_SUFFIXES)}
    return json.dumps({"integrity": integrity}, sort_keys=True, separators=(",", ":"))


def with_integrity(index: str, files: Mapping[str, bytes]) -> tuple[str, str]:
    """`index` with `integrity` on every script and stylesheet naming a bundle file and the
    import map before its first script; and the import map's text."""

    def tagged(found: re.Match[str]) -> str:
        start, url, rest = found.groups()
        name = url.removeprefix("./")
        if name not in files or "integrity=" in rest:
            return found.group(0)
        return f'<{start}="{url}" integrity="{sri(files[name])}"{rest}>'

    text = _SCRIPT_OR_STYLE.sub(tagged, index)
    mapping = import_map(files)
    element = f'<script type="importmap">{mapping}</script>\n  '
    at = text.find("<script")
    if at < 0:
        at = text.find("</head>")
    if at < 0:
        raise BundleError(f"{INDEX} has neither a script nor a </head>")
    return text[:at] + element + text[at:], mapping


def served_bundle(files: Mapping[str, bytes]) -> ServedBundle:
    """The bundle as served: index.html with SRI and its import map, the rest as read."""
    index, mapping = with_integrity(files[INDEX].decode("utf-8"), files)
    served = dict(files)
    served[INDEX] = index.encode("utf-8")
    digest = base64.b64encode(hashlib.sha256(mapping.encode()).digest()).decode()
    return ServedBundle(files=served, import_map_sha256=digest)


def bundle_from_folder(folder: Path) -> ServedBundle:
    """read_bundle then served_bundle."""
    return served_bundle(read_bundle(folder))


def fingerprint(folder: Path) -> tuple[tuple[str, int, int, int], ...]:
    """What changes when a file of `folder` is written or replaced (path, inode, size,
    mtime): a cache of the served bundle is rebuilt when it differs."""
    seen = []
    for item in sorted(folder.rglob("*")):
        stat = item.lstat()
        seen.append((item.as_posix(), stat.st_ino, stat.st_size, stat.st_mtime_ns))
    return tuple(seen)


class BundleCache:
    """The served bundle of one folder, read again when its fingerprint changes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._seen: tuple[tuple[str, int, int, int], ...] | None = None
        self._bundle: ServedBundle | None = None

    def current(self) -> ServedBundle:
        """The bundle as served now (BundleError, OSError if the folder cannot be read)."""
        seen = fingerprint(self.folder)
        if self._bundle is None or seen != self._seen:
            self._bundle = bundle_from_folder(self.folder)
            self._seen = seen
        return self._bundle


class ManifestError(ValueError):
    """A manifest that is not one (not JSON, another format or version, a bad entry)."""


def parse_manifest(data: bytes) -> dict[str, str]:
    """A served manifest's files, path -> SHA-256 hex; ManifestError when it is garbled
    (the client reads the relay's manifest: hostile input)."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ManifestError("the manifest is not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"the manifest's format is not {MANIFEST_FORMAT!r}")
    if doc.get("version") != MANIFEST_VERSION:
        raise ManifestError(f"the manifest's version is not {MANIFEST_VERSION}")
    entries = doc.get("files")
    if not isinstance(entries, list) or len(entries) > MAX_FILES:
        raise ManifestError("the manifest's files are not a list within bounds")
    files: dict[str, str] = {}
    for entry in entries:
        path, digest = _entry(entry)
        if path in files:
            raise ManifestError(f"the manifest names {path!r} twice")
        files[path] = digest
    return files


_HEX64: Final = re.compile(r"[0-9a-f]{64}")


def _entry(entry: object) -> tuple[str, str]:
    if not isinstance(entry, dict):
        raise ManifestError("a manifest entry is not an object")
    path, digest = entry.get("path"), entry.get("sha256")
    if not isinstance(path, str) or not is_bundle_path(path):
        raise ManifestError(f"a manifest entry's path is not a bundle path: {str(path)[:80]!r}")
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
        raise ManifestError(f"the manifest's SHA-256 of {path!r} is not 64 hex digits")
    return path, digest
