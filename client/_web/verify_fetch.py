"""What `engram-sync web verify` fetches from a relay (docs/web-vault.md "Verifying the
relay's copy"): its manifest, every file it lists or this install has, the page at /vault/
and its policy. The relay is hostile input: timeouts, no redirects, each answer and the whole
read within bounds, the manifest's paths checked before any is fetched
(shared_format.web_bundle.parse_manifest)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import httpx

from engram_sync.shared_format.web_bundle import (
    INDEX,
    MANIFEST_PATH,
    MAX_FILE_BYTES,
    ManifestError,
    parse_manifest,
)

from .verify import Served

TIMEOUT: Final = httpx.Timeout(10.0)
MAX_MANIFEST_BYTES: Final = 1024 * 1024
MAX_TOTAL_BYTES: Final = 64 * 1024 * 1024


class VerifyError(Exception):
    """The relay could not be reached or answered something that is not a web vault."""


class _Reader:
    """GETs under one root, each answer cut at its bound, the sum bounded too."""

    def __init__(self, client: httpx.Client, root: str) -> None:
        self.client = client
        self.root = root
        self.total = 0

    def get(self, path: str, bound: int) -> tuple[int, bytes, str | None]:
        """(status, body up to bound + 1 bytes, CSP header)."""
        try:
            with self.client.stream("GET", self.root + path) as answer:
                body = bytearray()
                for chunk in answer.iter_bytes():
                    body += chunk
                    if len(body) > bound:
                        break
                policy = answer.headers.get("content-security-policy")
                status = answer.status_code
        except httpx.HTTPError as exc:
            raise VerifyError(
                f"the relay at {self.root} did not answer: {type(exc).__name__}"
            ) from None
        self.total += len(body)
        if self.total > MAX_TOTAL_BYTES:
            raise VerifyError(f"the relay at {self.root} served more than {MAX_TOTAL_BYTES} bytes")
        return status, bytes(body[: bound + 1]), policy


def fetch(root: str, installed: Iterable[str]) -> Served:
    """The relay's copy under `root` (a /vault/ URL): its manifest's files and `installed`'s.
    VerifyError when unreachable, without a manifest or with a garbled one."""
    with httpx.Client(timeout=TIMEOUT, follow_redirects=False) as client:
        reader = _Reader(client, root)
        status, body, _ = reader.get(MANIFEST_PATH, MAX_MANIFEST_BYTES)
        if status != 200:
            raise VerifyError(f"the relay at {root} serves no web vault manifest (HTTP {status})")
        if len(body) > MAX_MANIFEST_BYTES:
            raise VerifyError(f"the relay's manifest at {root} is larger than allowed")
        try:
            listed = parse_manifest(body)
        except ManifestError as exc:
            raise VerifyError(f"the relay's manifest at {root} is garbled: {exc}") from None
        files: dict[str, bytes | None] = {}
        policies: dict[str, str | None] = {}
        for path in sorted(set(listed) | set(installed)):
            status, data, policy = reader.get(path, MAX_FILE_BYTES)
            files[path] = data if status == 200 else None
            if path == INDEX:
                policies[INDEX] = policy
        status, page, policies["/vault/"] = reader.get("", MAX_FILE_BYTES)
    return Served(listed, files, page if status == 200 else None, policies)
