"""`engram-sync web verify`'s decisions (docs/web-vault.md "Verifying the relay's copy"): what
the relay served at /vault/ against what this install serves (shared_format.web_bundle), as a
list of findings, each naming a file. Pure: the fetching is in verify_fetch.

A finding for every file the relay serves differently (`changed`), does not serve (`missing`),
serves or lists beyond this install (`added`), and for a manifest that does not say what the
relay serves (`manifest`); the page at `/vault/` itself (`page`) and its Content-Security-
Policy (`policy`) are checked too, since that is what a browser loads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from engram_sync.shared_format.web_bundle import INDEX, ServedBundle, sha256_hex

#: The root of the bundle under a relay's base URL.
VAULT_PATH: Final = "/vault/"
_SHORT: Final = 12  # hex digits of a SHA-256 shown in a finding


@dataclass(frozen=True)
class Finding:
    """One difference: its kind (changed, missing, added, manifest, page, policy), the file
    it concerns and what was seen."""

    kind: str
    path: str
    detail: str


@dataclass
class Served:
    """What the relay answered: its manifest (path -> SHA-256 hex), each file's bytes (None:
    not served), the page at /vault/ and the CSP it came with (None: no such header)."""

    listed: Mapping[str, str]
    files: Mapping[str, bytes | None]
    page: bytes | None = None
    policies: Mapping[str, str | None] = field(default_factory=dict)


def vault_url(url: str) -> str:
    """The bundle's root for `url`, a relay's base URL or its /vault/ (ValueError unless
    http(s) with a host). Query and fragment are dropped."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{url[:200]!r} is not an http(s) URL")
    path = parts.path.rstrip("/")
    if not path.endswith(VAULT_PATH.rstrip("/")):
        path += VAULT_PATH.rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, path + "/", "", ""))


def _short(digest: str) -> str:
    return digest[:_SHORT]


def file_findings(path: str, local: ServedBundle, served: Served) -> list[Finding]:
    """The findings about one file of this install or of the relay's manifest."""
    mine = local.files.get(path)
    got = served.files.get(path)
    listed = served.listed.get(path)
    found: list[Finding] = []
    if mine is None:
        how = "served" if got is not None else "listed in its manifest, not served"
        found.append(Finding("added", path, f"the relay has it ({how}); this install does not"))
    elif got is None:
        found.append(Finding("missing", path, "in this install; the relay does not serve it"))
    elif got != mine:
        found.append(
            Finding(
                "changed",
                path,
                f"served sha256 {_short(sha256_hex(got))}, "
                f"installed {_short(sha256_hex(mine))} ({len(got)} bytes, installed {len(mine)})",
            )
        )
    found.extend(_manifest_findings(path, mine, got, listed))
    return found


def _manifest_findings(
    path: str, mine: bytes | None, got: bytes | None, listed: str | None
) -> list[Finding]:
    """A manifest that leaves out a file it serves, or names a hash other than the served
    bytes' (a file neither listed nor served is `missing` already)."""
    if listed is None and got is not None and mine is not None:
        return [Finding("manifest", path, "served, but left out of the relay's manifest")]
    if listed is not None and got is not None and listed != sha256_hex(got):
        return [
            Finding(
                "manifest",
                path,
                f"the manifest says sha256 {_short(listed)}, "
                f"the relay served {_short(sha256_hex(got))}",
            )
        ]
    return []


def page_findings(local: ServedBundle, served: Served) -> list[Finding]:
    """The page a browser loads at /vault/, and the CSP of it and of index.html."""
    found: list[Finding] = []
    if served.page != local.files[INDEX]:
        digest = "nothing" if served.page is None else f"sha256 {_short(sha256_hex(served.page))}"
        found.append(
            Finding("page", VAULT_PATH, f"the page at /vault/ is {digest}, not this install's")
        )
    expected = local.content_security_policy
    for where, policy in sorted(served.policies.items()):
        # A browser enforces every policy sent; ours must be one of them, exactly.
        if policy is None or expected not in (p.strip() for p in policy.split(",")):
            found.append(Finding("policy", where, policy_difference(policy, expected)))
    return found


def policy_difference(served: str | None, expected: str) -> str:
    """What a served Content-Security-Policy has and lacks against this install's, by
    directive."""
    if served is None:
        return "no Content-Security-Policy (this install's forbids inline script and eval)"
    mine = {d.strip() for d in expected.split(";")}
    theirs = {d.strip() for d in served.replace(",", ";").split(";") if d.strip()}
    extra = "; ".join(sorted(theirs - mine))[:200] or "nothing"
    lacking = "; ".join(sorted(mine - theirs))[:200] or "nothing"
    return f"the Content-Security-Policy has {extra!r} and lacks {lacking!r}"


def findings(local: ServedBundle, served: Served) -> list[Finding]:
    """Every difference between the relay's copy and this install's, by file."""
    paths = sorted(set(local.files) | set(served.listed) | set(served.files))
    found = [f for path in paths for f in file_findings(path, local, served)]
    return found + page_findings(local, served)


def report(url: str, local: ServedBundle, found: list[Finding], version: str) -> list[str]:
    """The lines `web verify` prints: one for a match, else a heading and a line a finding."""
    if not found:
        return [
            f"the web vault at {url} matches this install (engram-sync {version}): "
            f"{len(local.files)} files, the page and its policy"
        ]
    heading = (
        f"the web vault at {url} differs from this install (engram-sync {version}): "
        f"{len(found)} finding{'s' if len(found) != 1 else ''}"
    )
    return [heading, *(f"  {f.kind:<9}{f.path}: {f.detail}" for f in found)]
