"""Markdown notes as memories to import: one per file, or one per heading.

A note may open with front matter between two `---` lines. Of it, `tags:` (`[a, b]`,
`a, b`, or `- a` items on the following lines), `project:`, `layer:` and `created_at:`
(RFC 3339) are read; other keys are ignored. This is the small subset of YAML notes
tools write, read without a YAML library (the client has none as a dependency). A note
without `created_at` gets its file's modification time (docs/import-export.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from engram_sync.client._vault.transfer import ImportFields, ImportItem, Invalid, memory_from_fields
from engram_sync.shared_format.plaintext import Layer
from engram_sync.shared_format.timestamps import format_rfc3339, utc_now_rfc3339

LAYERS: Final = ("episodic", "semantic", "imagined")
_HEADING: Final = re.compile(r"^ {0,3}#{1,6}(\s|$)")
_FENCE: Final = re.compile(r"^ {0,3}(```|~~~)")
_KEY: Final = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)\s*:\s*(.*)$")


@dataclass
class FrontMatter:
    """What a note's front matter says (only the keys this import reads)."""

    tags: list[str] = field(default_factory=list)
    project: str | None = None
    layer: Layer | None = None
    created_at: str | None = None


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _list_value(text: str) -> list[str]:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return [item for item in (_unquote(part) for part in text.split(",")) if item]


def parse_front_matter(lines: list[str]) -> tuple[FrontMatter, int]:
    """(front matter, index of the first body line); no front matter: (empty, 0).

    ValueError for a bad `layer` or an unclosed block."""
    if not lines or lines[0].strip() != "---":
        return FrontMatter(), 0
    matter = FrontMatter()
    key: str | None = None
    for index in range(1, len(lines)):
        line = lines[index].rstrip()
        if line.strip() in ("---", "..."):
            return matter, index + 1
        item = line.strip()
        if item.startswith("- ") and key == "tags":
            value = _unquote(item[2:])
            if value:
                matter.tags.append(value)
            continue
        match = _KEY.match(line)
        if match is None:
            continue
        key, value = match.group(1).lower(), match.group(2)
        if key == "tags":
            matter.tags.extend(_list_value(value))
        elif key == "project":
            matter.project = _unquote(value) or None
        elif key == "layer":
            layer = _unquote(value)
            if layer not in LAYERS:
                raise ValueError(f"front matter layer must be one of {', '.join(LAYERS)}")
            matter.layer = layer  # type: ignore[assignment]
        elif key == "created_at":
            matter.created_at = _unquote(value) or None
    raise ValueError("the front matter has no closing `---` line")


def split_sections(lines: list[str], first: int) -> Iterator[tuple[int, str]]:
    """(line index, text) of each heading's section; text before the first heading is a
    section of its own. Lines in fenced code blocks are never headings."""
    start, fenced = first, False
    for index in range(first, len(lines)):
        line = lines[index]
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and _HEADING.match(line) and index > start:
            yield start, "".join(lines[start:index])
            start = index
    if start < len(lines):
        yield start, "".join(lines[start:])


def note_items(path: Path, *, split_headings: bool, label: str) -> Iterator[ImportItem]:
    """The memories of one note file (`label` names it in the summary)."""
    try:
        text = path.read_text(encoding="utf-8")
        modified_at = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    except (OSError, UnicodeDecodeError) as exc:
        yield Invalid(label, f"cannot read: {exc}")
        return
    lines = text.splitlines(keepends=True)
    try:
        matter, body = parse_front_matter(lines)
    except ValueError as exc:
        yield Invalid(f"{label}:1", str(exc))
        return
    sections = (
        split_sections(lines, body) if split_headings else iter([(body, "".join(lines[body:]))])
    )
    now = utc_now_rfc3339()
    for order, (index, content) in enumerate(sections):
        where = f"{label}:{index + 1}"
        if not content.strip():
            if not split_headings:
                yield Invalid(where, "the note is empty")
            continue
        fields = ImportFields(
            content=content.strip(),
            layer=matter.layer or "episodic",
            created_at=matter.created_at or _nth_after(modified_at, order),
            tags=list(matter.tags),
            project=matter.project,
        )
        try:
            yield memory_from_fields(fields, where, now)
        except ValueError as exc:
            yield Invalid(where, str(exc))


def _nth_after(moment: datetime, order: int) -> str:
    """The file's time plus `order` microseconds: a file's sections keep their order in
    `list` (oldest first)."""
    return format_rfc3339(moment + timedelta(microseconds=order))


def markdown_files(root: Path) -> list[Path]:
    """`root` itself, or every `*.md` file under it, in path order."""
    if root.is_dir():
        return sorted(p for p in root.rglob("*.md") if p.is_file())
    return [root]
