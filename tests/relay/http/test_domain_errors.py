"""The rules and store layers make no HTTP errors (issue 19, "Errors"; STYLE "Errors have
one owner per layer"): they raise `relay.domain.domain_errors`, and `relay.http.errors` maps
every one of those to its answer (the answers themselves: tests/relay/http/test_refusal_bodies.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engram_sync.relay.domain import domain_errors
from engram_sync.relay.http.errors import EXCEPTION_HANDLERS

RELAY = Path(__file__).resolve().parents[3] / "relay"
# Below the HTTP edge: pure rules, the group commit, the store, the refusals themselves.
BELOW_THE_EDGE = sorted(
    [
        RELAY / "domain" / "domain_errors.py",
        RELAY / "domain" / "push_rules.py",
        RELAY / "services" / "push_groups.py",
        *(RELAY / "store").glob("*.py"),
    ]
)
# The web framework, and the module that turns refusals into HTTP answers.
HTTP_MODULES = ("litestar", "engram_sync.relay.http.errors")


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports (absolute names; `from a import b` counts as a and a.b),
    wherever the import statement is (TYPE_CHECKING blocks and functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            package = node.module
            if node.level:  # relative: resolve against the module's package
                parts = path.relative_to(RELAY.parent).with_suffix("").parts[: -node.level]
                package = ".".join([*parts, node.module])
            found.add(package)
            found.update(f"{package}.{alias.name}" for alias in node.names)
    return found


def http_imports(path: Path) -> list[str]:
    return sorted(
        name
        for name in imported_modules(path)
        if any(name == m or name.startswith(f"{m}.") for m in HTTP_MODULES)
    )


@pytest.mark.parametrize("path", BELOW_THE_EDGE, ids=lambda p: str(p.relative_to(RELAY)))
def test_no_http_below_the_edge(path: Path) -> None:
    assert http_imports(path) == []


def test_the_scan_sees_http_imports_where_they_are() -> None:
    """The positive case next to the exclusion: the scan does find them at the edge."""
    assert "engram_sync.relay.http.errors.bad_request" in http_imports(
        RELAY / "http" / "routes" / "sync.py"
    )
    assert "litestar" in http_imports(RELAY / "http" / "routes" / "sync.py")
    assert "litestar.exceptions" in http_imports(RELAY / "http" / "errors.py")
    assert len(BELOW_THE_EDGE) > 10  # the store's modules are all in the scan


def _leaves(cls: type[Exception]) -> list[type[Exception]]:
    subclasses = cls.__subclasses__()
    return [cls] if not subclasses else [leaf for sub in subclasses for leaf in _leaves(sub)]


def test_every_domain_error_has_its_own_answer() -> None:
    """A refusal without a handler would fall through to the 500 of `Exception`."""
    leaves = _leaves(domain_errors.DomainError)
    assert {c.__name__ for c in leaves} >= {
        "EmptyBatchError",
        "BatchTooLargeError",
        "InvalidBlobError",
        "QuotaExceededError",
        "ResyncRequiredError",
        "ShuttingDownError",
    }
    assert [c.__name__ for c in leaves if c not in EXCEPTION_HANDLERS] == []
