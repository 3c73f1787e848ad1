"""The README and the docs hold together (issue 32, "The README as a front door, docs as the
house"): every relative link resolves to a file of the repository, and a `#anchor` into a
Markdown page to one of its headings; every page of docs/ is listed in docs/index.md; and
docs/architecture.md stays true to the code (each module path it names exists, each import
contract of pyproject.toml is in its table)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def pages() -> list[Path]:
    """The Markdown the links are checked in."""
    found = [ROOT / "README.md", ROOT / "RELIABILITY.md", *sorted(DOCS.glob("*.md"))]
    found += sorted((ROOT / "deploy").glob("*.md"))
    found += [p for p in [ROOT / "bench" / "README.md"] if p.exists()]
    return found


def prose(text: str) -> str:
    """`text` without fenced blocks and code spans, where a `[x](y)` is no link."""
    return _CODE_SPAN.sub("``", _FENCE.sub("", text))


def links(text: str) -> list[str]:
    return _LINK.findall(prose(text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped (letters,
    digits, `_` and `-` kept), each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, heading in _HEADING.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path, text: str) -> list[str]:
    """The relative links of `text` (the content of `page`) that resolve to nothing."""
    broken = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target} (no file {resolved})")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading #{anchor} in {resolved.name})")
    return broken


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page, page.read_text(encoding="utf-8")) == []


def test_the_link_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A page\n\n## Its section\n", encoding="utf-8")
    page = tmp_path / "here.md"
    text = (
        "[ok](there.md) [ok](there.md#its-section) [web](https://example.org/x) `[code](x.md)`\n"
        "[gone](missing.md) [no heading](there.md#nowhere) [self](#nor-here)\n"
        "```\n[fenced](fenced.md)\n```\n"
    )
    page.write_text(text, encoding="utf-8")
    assert [b.split(" ")[0] for b in broken_links(page, text)] == [
        "missing.md",
        "there.md#nowhere",
        "#nor-here",
    ]
    assert slug("The successor statement (PROTOCOL §19, last bullet; revision 0016)") == (
        "the-successor-statement-protocol-19-last-bullet-revision-0016"
    )
    assert slug("`engram-relay` commands") == "engram-relay-commands"


def test_every_docs_page_is_in_the_index() -> None:
    listed = set(links((DOCS / "index.md").read_text(encoding="utf-8")))
    for page in sorted(DOCS.glob("*.md")):
        if page.name != "index.md":
            assert page.name in listed, f"docs/{page.name} is not linked from docs/index.md"


def test_the_readme_links_the_index_and_stays_short() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/index.md" in links(readme)
    assert len(readme.splitlines()) <= 300


def test_the_architecture_page_names_modules_that_exist() -> None:
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:client|relay|shared_format|tests|bench|deploy)/[\w/.-]*)`", text))
    assert len(named) > 20
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert missing == [], "docs/architecture.md names modules that are not there"


def test_the_architecture_page_lists_every_import_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    assert contracts
    for contract in contracts:
        assert f"| `{contract['id']}` |" in text, f"contract {contract['id']} not in the table"
