"""Markdown notes as memories to import: one per file, or one per heading.

A note may open with front matter between two `---` lines. Of it, `tags:` (`[a, b]`,
`a, b`, or `- a` items on the following lines), `project:`, `layer:` and `created_at:`
(RFC 3339) are read; other keys are ignored. This is the small subset of YAML notes
tools write, read without a YAML library (the client has none as a dependency). A note
without `created_at` gets its file's modification time (docs/import-export.md).

A folder of notes is hostile input (issue 31): no symbolic link in it is followed, to a
file or to a folder, since `leak.md -> ~/.ssh/id_ed25519` would import the key as a
memory and the next sync would share it. The folder is listed without following links,
and each note is opened one path component at a time under the folder's own descriptor
with O_NOFOLLOW, so a link put in place between the listing and the read is refused too.
Every link skipped, and every `*.md` entry that is not a regular file, is named in the
summary. The file or folder named on the command line is the root, taken as named.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from engram_sync.shared_format.plaintext import Layer
from engram_sync.shared_format.timestamps import format_rfc3339, utc_now_rfc3339

from .transfer import ImportFields, ImportItem, Invalid, memory_from_fields

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


LINK_SKIPPED: Final = "a symbolic link: not followed (only files inside the folder are imported)"
NOT_A_FILE: Final = "not a regular file: skipped"
_NO_LINK: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class NotFollowedError(ValueError):
    """A note that is a link, under a link, or not a regular file: skipped, with why."""


def read_beneath(root: Path, relative: Path) -> tuple[str, float]:
    """The UTF-8 text and modification time of `relative` under the folder `root`,
    following no symbolic link below `root` (module docstring). NotFollowedError for a
    link or what is not a regular file; OSError, UnicodeDecodeError."""
    directory = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in relative.parts[:-1]:
            try:
                inner = os.open(part, _NO_LINK | os.O_DIRECTORY, dir_fd=directory)
            except OSError as exc:
                raise _not_followed(exc) from None
            os.close(directory)
            directory = inner
        try:  # O_NONBLOCK: a FIFO named like a note does not hang the import
            fd = os.open(relative.parts[-1], _NO_LINK | os.O_NONBLOCK, dir_fd=directory)
        except OSError as exc:
            raise _not_followed(exc) from None
    finally:
        os.close(directory)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise NotFollowedError(NOT_A_FILE)
        data = handle.read()
    return data.decode("utf-8"), info.st_mtime


def _not_followed(exc: OSError) -> OSError | NotFollowedError:
    # O_NOFOLLOW on a link: ELOOP; O_DIRECTORY|O_NOFOLLOW on a link to a folder: ENOTDIR
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return NotFollowedError(LINK_SKIPPED)
    return exc


def note_items(
    root: Path, relative: Path, *, split_headings: bool, label: str
) -> Iterator[ImportItem]:
    """The memories of the note `relative` under the folder `root` (`label` names it in
    the summary)."""
    try:
        text, mtime = read_beneath(root, relative)
        modified_at = datetime.fromtimestamp(mtime, UTC)
    except NotFollowedError as exc:
        yield Invalid(label, str(exc))
        return
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


@dataclass
class NoteFiles:
    """The notes an import reads: paths relative to the folder `root`, in path order, and
    what was skipped (links, `*.md` entries that are not files), with why."""

    root: Path
    files: list[Path] = field(default_factory=list)
    skipped: list[Invalid] = field(default_factory=list)


def markdown_files(named: Path) -> NoteFiles:
    """The note `named`, or every `*.md` file under the folder `named`, following no
    symbolic link below it (module docstring)."""
    if not named.is_dir():
        resolved = named.resolve()  # the file named on the command line, taken as named
        return NoteFiles(resolved.parent, [Path(resolved.name)])
    notes = NoteFiles(named.resolve())
    _walk(notes, Path())
    notes.files.sort()
    notes.skipped.sort(key=lambda item: item.where)
    return notes


def _walk(notes: NoteFiles, top: Path) -> None:
    # a stack, not recursion: a folder nested thousands deep is hostile input too
    pending = [top]
    while pending:
        relative = pending.pop()
        try:
            with os.scandir(notes.root / relative) as listing:
                entries = list(listing)
        except OSError as exc:
            notes.skipped.append(Invalid(str(relative), f"cannot list: {exc.strerror or exc}"))
            continue
        for entry in entries:
            path = relative / entry.name
            if entry.is_symlink():
                if entry.name.endswith(".md") or entry.is_dir():  # is_dir: where it points
                    notes.skipped.append(Invalid(str(path), LINK_SKIPPED))
            elif entry.is_dir(follow_symlinks=False):
                pending.append(path)
            elif entry.name.endswith(".md"):
                if entry.is_file(follow_symlinks=False):
                    notes.files.append(path)
                else:
                    notes.skipped.append(Invalid(str(path), NOT_A_FILE))
