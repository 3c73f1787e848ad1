"""The web vault's bundle at /vault/ (issue 34, docs/web-vault.md "Served by the relay"):
the files of the manifest and nothing else, each as shared_format.web_bundle serves it
(index.html with Subresource Integrity), `/vault/manifest.json`, and the strict CSP.

No route here needs a key: the bundle is public code. A path that is not a file of the
manifest is a JSON 404 (no directory listing, no path outside the bundle: the lookup is by
name in the manifest, never a filesystem path built from the request)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from litestar import Request, Response, get
from litestar.params import FromPath
from litestar.response import Redirect

from engram_sync.relay.http.errors import RelayError
from engram_sync.shared_format.web_bundle import (
    INDEX,
    MANIFEST_PATH,
    BundleCache,
    ServedBundle,
    content_type,
    installed_bundle_dir,
)

#: The headers of every answer under /vault/ but the CSP (the bundle's: web_bundle).
HEADERS: Final = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _not_found(path: str) -> RelayError:
    return RelayError(
        404, "not_found", f"no file {path[:200]!r} in this relay's web vault (see manifest.json)"
    )


def _answer(bundle: ServedBundle, body: bytes, media_type: str) -> Response[bytes]:
    headers = {**HEADERS, "Content-Security-Policy": bundle.content_security_policy}
    return Response(body, media_type=media_type, headers=headers)


def routes(folder: str | None) -> list[Any]:
    """The routes serving the bundle of `folder` (None: the installed package's)."""
    cache = BundleCache(Path(folder) if folder else installed_bundle_dir())

    def current() -> ServedBundle:
        try:
            return cache.current()
        except (OSError, ValueError):  # the operator's folder is missing or unservable
            raise RelayError(
                404, "web_vault_unavailable", "this relay's web vault bundle cannot be read"
            ) from None

    @get("/vault", include_in_schema=False)
    async def vault_index(request: Request[Any, Any, Any]) -> Response[bytes] | Redirect:
        """index.html at `/vault/`; `/vault` (the same route to Litestar) is sent to
        `/vault/`, so the page's relative URLs resolve under /vault/."""
        raw: bytes = request.scope.get("raw_path") or b""  # `path` has lost its slash
        if not raw.split(b"?")[0].endswith(b"/"):
            return Redirect("vault/", status_code=308)
        bundle = current()
        return _answer(bundle, bundle.files[INDEX], content_type(INDEX))

    @get("/vault/{name:path}", include_in_schema=False)
    async def vault_file(name: FromPath[str]) -> Response[bytes]:
        bundle = current()
        name = name.removeprefix("/")
        if name == MANIFEST_PATH:
            return _answer(bundle, bundle.manifest_bytes(), "application/json")
        if name == "" or name not in bundle.files:
            raise _not_found(name)
        return _answer(bundle, bundle.files[name], content_type(name))

    return [vault_index, vault_file]
