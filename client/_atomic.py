"""Crash-safe files: write a temp file of its own, fsync it, rename, fsync the directory."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import msgspec


@contextmanager
def atomic_text_file(path: Path, mode: int = 0o600, *, durable: bool = True) -> Iterator[IO[str]]:
    """A text handle whose content replaces `path` once the block ends without an error
    (a crash or an error leaves the old file, or none).

    `durable=False` skips the directory's fsync: the content is still fsynced before the
    rename (never an empty or partial file), but a crash may undo the rename and leave the
    previous file. Only for a file whose previous version is always safe to find again
    (sync_state.json: a cursor behind committed rows; never device.json's clock, §8).

    The temp file is made by mkstemp in `path`'s directory (O_CREAT|O_EXCL, a random
    name, 0600 from the start), so it is never a file or link someone else put there
    first (issue 31), and two writers never rename each other's file away (the last
    rename wins; client._sync.lock keeps syncs apart).
    """
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json_atomic(
    path: Path, payload: Any, mode: int = 0o600, *, durable: bool = True
) -> bytes:
    """Replace `path` with `payload` as JSON so a crash leaves the old or the new file.

    Keys sorted, indented by 2, UTF-8 unescaped: for strings, integers, booleans, null,
    lists and dicts the bytes `json.dump(indent=2, sort_keys=True, ensure_ascii=False)`
    wrote, made by msgspec in a tenth of its time (issue 36: sync_state.json is written
    at the end of every sync; tests/client/test_atomic.py compares the two). `durable`: as
    `atomic_text_file`. Returns the file's bytes."""
    text = msgspec.json.format(msgspec.json.encode(payload, order="sorted"), indent=2) + b"\n"
    with atomic_text_file(path, mode, durable=durable) as handle:
        handle.write(text.decode("utf-8"))
    return text


def read_json(path: Path) -> Any:
    """The parsed JSON of `path`; ValueError naming the file when it is not JSON."""
    return parse_json(path.read_bytes(), path)


def parse_json(raw: bytes, path: Path) -> Any:
    """`raw` (the bytes of `path`) parsed; ValueError naming the file when it is not JSON."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); fix or remove it") from None
