"""`engram-sync export` and `engram-sync import`: memories out as JSONL, and in from
JSONL, Markdown notes or another vault (docs/import-export.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Annotated, Final

import typer

from engram_sync.shared_format.errors import WrongPassphraseError
from engram_sync.shared_format.vault import open_vault

from .._atomic import atomic_text_file
from .._vault.notes import NoteFiles, markdown_files, note_items
from .._vault.transfer import (
    DEFAULT_BATCH,
    MAX_LINE_BYTES,
    Importer,
    ImportItem,
    ImportSummary,
    LineTooLong,
    bounded_lines,
    export_lines,
    jsonl_items,
    vault_items,
)
from .support import CliError, err, open_session, out, print_json

SOURCE_PASSPHRASE_ENV: Final = "ENGRAM_SOURCE_PASSPHRASE"  # noqa: S105 - a variable's name
SHOWN_PROBLEMS: Final = 20  # invalid inputs listed one per line; the rest are counted
PROGRESS_EVERY: Final = 500  # items between two progress bar updates
MARKDOWN_SUFFIXES: Final = (".md", ".markdown")

Advance = Callable[[int], None]


def register(app: typer.Typer) -> None:
    """Add `export` and `import` to the `engram-sync` app."""
    app.command("export")(export_command)
    app.command("import")(import_command)


def export_command(
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Write to this file (created 0600) instead of stdout.",
            metavar="FILE",
        ),
    ] = None,
    include_deleted: Annotated[
        bool,
        typer.Option(
            "--include-deleted",
            help='Also write deletions not yet pushed, as {"deleted": true, "id": ...}.',
        ),
    ] = False,
) -> None:
    """Write every memory as JSONL: one PROTOCOL §4 plaintext per line, every field."""
    with open_session() as session:
        lines = export_lines(session.vault.conn, include_deleted=include_deleted)
        if output is None:
            count = _write_lines(sys.stdout, lines)
            sys.stdout.flush()
        else:
            with atomic_text_file(output) as handle:  # 0600: it holds the memories in clear
                count = _write_lines(handle, lines)
            err.print(f"exported {count} line(s) to {output}")


def _write_lines(handle: IO[str], lines: Iterable[str]) -> int:
    count = 0
    for line in lines:
        handle.write(line)
        handle.write("\n")
        count += 1
    return count


# long: the command's options are its signature (typer); the body is 12 lines
def import_command(
    source: Annotated[
        str | None,
        typer.Argument(
            help="A JSONL file, - for standard input, or a Markdown note (.md) or folder of notes.",
            metavar="FILE|DIR|-",
            show_default=False,
        ),
    ] = None,
    from_vault: Annotated[
        Path | None,
        typer.Option(
            "--from-vault",
            help=f"Import another vault's memories (its passphrase: {SOURCE_PASSPHRASE_ENV} "
            "or a prompt).",
            metavar="DIR",
        ),
    ] = None,
    split_headings: Annotated[
        bool,
        typer.Option("--split-headings", help="Markdown: one memory per heading, not per file."),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Read and check everything, write nothing.")
    ] = False,
    keep_duplicates: Annotated[
        bool,
        typer.Option(
            "--keep-duplicates",
            help="Import memories whose content the vault already has (ids are still unique).",
        ),
    ] = False,
    batch: Annotated[
        int, typer.Option("--batch", help="Memories per transaction.", min=1, metavar="N")
    ] = DEFAULT_BATCH,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    max_line_bytes: Annotated[
        int,
        typer.Option(
            "--max-line-bytes",
            help="JSONL: a longer line is reported invalid and skipped, never read whole.",
            min=1,
            metavar="N",
        ),
    ] = MAX_LINE_BYTES,
) -> None:
    """Import memories; duplicates (same id, or same content hash) are skipped.

    Imported memories are new local changes: the next `sync` pushes them.
    """
    if (source is None) == (from_vault is None):
        raise CliError("give one source: FILE, DIR or - (standard input), or --from-vault DIR")
    with open_session() as session:
        importer = Importer(
            session.vault.conn, dry_run=dry_run, keep_duplicates=keep_duplicates, batch=batch
        )
        if from_vault is not None:
            summary = _import_vault(importer, from_vault.expanduser(), session.path)
        else:
            assert source is not None
            summary = _import_path(importer, source, split_headings, max_line_bytes)
    _report(summary, dry_run, json_out)


def _import_path(
    importer: Importer, source: str, split_headings: bool, max_line: int
) -> ImportSummary:
    if source == "-":
        lines = bounded_lines(sys.stdin.buffer, max_line)  # issue 31: no line read whole
        with _bar(None, "importing") as advance:
            return importer.feed_all(_counted(jsonl_items(lines), advance))
    path = Path(source).expanduser()
    if not path.exists():
        raise CliError(f"no such file or folder: {path}")
    if path.is_dir() or path.suffix.lower() in MARKDOWN_SUFFIXES:
        notes = markdown_files(path)
        if not notes.files:
            skipped = f" ({len(notes.skipped)} skipped: links are not followed)"
            raise CliError(
                f"no Markdown notes (*.md) under {path}{skipped if notes.skipped else ''}"
            )
        with _bar(len(notes.files), "notes") as advance:
            return importer.feed_all(_notes(notes, split_headings, advance))
    with path.open("rb") as handle, _bar(path.stat().st_size, "importing") as advance:
        return importer.feed_all(jsonl_items(_bytes_counted(handle, max_line, advance)))


def _notes(notes: NoteFiles, split_headings: bool, advance: Advance) -> Iterator[ImportItem]:
    yield from notes.skipped  # issue 31: links not followed, named in the summary
    for relative in notes.files:
        label = str(relative)
        yield from note_items(notes.root, relative, split_headings=split_headings, label=label)
        advance(1)


def _import_vault(importer: Importer, source: Path, target: Path) -> ImportSummary:
    if source.resolve() == target.resolve():
        raise CliError("--from-vault names this vault itself: nothing to import")
    if not (source / "engrams.db").exists():
        raise CliError(f"no vault at {source}: {source / 'engrams.db'} does not exist")
    passphrase = _source_passphrase()
    try:
        other = open_vault(source, passphrase)
    except WrongPassphraseError:
        raise CliError(
            f"wrong passphrase for the source vault {source}: check {SOURCE_PASSPHRASE_ENV} "
            "or the passphrase you typed"
        ) from None
    with other:
        total = int(other.conn.execute("SELECT count(*) FROM engrams").fetchone()[0])
        with _bar(total, "importing") as advance:
            return importer.feed_all(_counted(vault_items(other.conn), advance))


def _source_passphrase() -> str:
    env = os.environ.get(SOURCE_PASSPHRASE_ENV)
    if env:
        return env
    if not sys.stdin.isatty():
        raise CliError(
            f"no passphrase for the source vault: set {SOURCE_PASSPHRASE_ENV} or run in a "
            "terminal to be asked"
        )
    value: str = typer.prompt("Source vault passphrase", hide_input=True)
    return value


def _counted(items: Iterator[ImportItem], advance: Advance) -> Iterator[ImportItem]:
    count = 0
    for item in items:
        yield item
        count += 1
        if count == PROGRESS_EVERY:
            advance(count)
            count = 0
    advance(count)


def _bytes_counted(
    handle: IO[bytes], max_line: int, advance: Advance
) -> Iterator[bytes | LineTooLong]:
    size = 0
    for number, line in enumerate(bounded_lines(handle, max_line), start=1):
        size += line.size if isinstance(line, LineTooLong) else len(line)
        if number % PROGRESS_EVERY == 0:
            advance(size)
            size = 0
        yield line
    advance(size)


@contextmanager
def _bar(total: int | None, what: str) -> Iterator[Advance]:
    """A determinate progress bar with ETA on stderr when it is a terminal (no bar, and no
    cost, otherwise); `total` None: a count without an end (standard input)."""
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )

    if not err.is_terminal:
        yield lambda _: None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda n: bar.advance(task, n)


def _report(summary: ImportSummary, dry_run: bool, json_out: bool) -> None:
    if json_out:
        print_json(dict(summary.as_json(), dry_run=dry_run))
        return
    verb = "would add" if dry_run else "added"
    parts = [f"{verb} {summary.added}", f"skipped {summary.duplicates} duplicate(s)"]
    if summary.deletions:
        parts.append(f"recorded {summary.deletions} deletion(s)")
    parts.append(f"{len(summary.invalid)} invalid")
    out.print(", ".join(parts) + (" (dry run: nothing written)" if dry_run else ""))
    for problem in summary.invalid[:SHOWN_PROBLEMS]:
        err.print(f"  invalid: {problem.where}: {problem.reason}", markup=False)
    if len(summary.invalid) > SHOWN_PROBLEMS:
        err.print(f"  ... and {len(summary.invalid) - SHOWN_PROBLEMS} more invalid")
    if summary.added and not dry_run:
        err.print("run `engram-sync sync` to push them")
