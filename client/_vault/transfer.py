"""Getting memories out of a vault and into one: JSONL export, and the import pipeline
every source (JSONL, Markdown notes, another vault) feeds (docs/import-export.md).

An export line is the memory's PROTOCOL §4 plaintext with two additive keys, present
only when the vault holds them (§4: unknown keys are ignored on read): `agent_id` (an
engrams column the plaintext does not carry) and `embedding_created_at` (when the
embedding's own stamp is not the memory's `modified_at`). A deletion still waiting to
be pushed exports as `{"deleted": true, "deleted_at": …, "id": …}`.

Import writes new local rows, so the next sync pushes them (`synced_at` NULL, PROTOCOL
§8). Ids, `created_at` and `modified_at` are kept as the line gives them (a line
without an id gets a new one, without `created_at` the import's time); `modified_at` is
written in the canonical form (VAULT §3: the push cursor compares text). Duplicates are
skipped, as the reference store skips a capture it already holds: a memory whose id the
vault already has (or an earlier line had), or whose normalized content hash (VAULT §4)
one of them has; a link to a memory skipped for its content goes to the memory it
duplicates. `keep_duplicates` turns the hash check off (the id check stays). A deletion
line records a pending deletion for an id the vault does not hold; an import never
deletes a memory the vault holds.
"""

from __future__ import annotations

import gc
import json
import math
import re
import sqlite3
import struct
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any, Final

import msgspec

from engram_sync.shared_format.ids import check_id
from engram_sync.shared_format.plaintext import (
    LINK_TYPES,
    SOURCES,
    STRENGTH_RANGE,
    VALENCE_RANGE,
    Layer,
    Link,
    MemoryPlaintext,
    PrivacyLevel,
)
from engram_sync.shared_format.timestamps import format_rfc3339, parse_rfc3339, utc_now_rfc3339
from engram_sync.shared_format.vault.content_hash import normalized_hash

from .store import (
    list_memories,
    named_rows,
    new_memory_id,
)

DEFAULT_BATCH: Final = 20_000  # memories per import transaction (bench figure 11)
IMPORT_CACHE_KIB: Final = -262144  # PRAGMA cache_size during an import: 256 MiB (negative = KiB)
_TAG_TEXTS_KEPT: Final = 10_000  # distinct tag lists whose JSON an import keeps
DEFAULT_EMBEDDING_MODEL: Final = "all-MiniLM-L6-v2"
# issue 31: a JSONL line longer than this is an invalid line, never read whole (one 150 MB
# line took 1.29 GB to read and gave a memory no relay accepts: a blob's ciphertext is at
# most about 1 MiB, PROTOCOL §6 step 2, and an export line of such a memory with a
# 384-value embedding is far below 16 MiB)
MAX_LINE_BYTES: Final = 16 * 1024 * 1024
_SKIP_CHUNK: Final = 1024 * 1024  # bytes read at a time past a line that is too long


# --- export ----------------------------------------------------------------------------------


def export_lines(conn: sqlite3.Connection, *, include_deleted: bool = False) -> Iterator[str]:
    """One JSON line per memory, oldest first; then, with `include_deleted`, one per
    pending deletion (module docstring)."""
    agents = dict(conn.execute("SELECT id, agent_id FROM engrams WHERE agent_id IS NOT NULL"))
    stamps = dict(conn.execute("SELECT engram_id, created_at FROM engram_embeddings"))
    for memory in list_memories(conn):
        record: dict[str, Any] = msgspec.structs.asdict(memory)
        agent = agents.get(memory.id)
        if agent is not None:
            record["agent_id"] = agent
        stamp = stamps.get(memory.id)
        if memory.embedding is not None and stamp is not None and stamp != memory.modified_at:
            record["embedding_created_at"] = stamp
        yield msgspec.json.encode(record, order="sorted").decode()
    if include_deleted:
        for row in named_rows(
            conn, "SELECT id, deleted_at FROM tombstones ORDER BY deleted_at, id"
        ):
            tomb = {"deleted": True, "deleted_at": row["deleted_at"], "id": row["id"]}
            yield msgspec.json.encode(tomb, order="sorted").decode()


# --- what an import is fed -------------------------------------------------------------------


@dataclass(frozen=True)
class ImportMemory:
    """One memory to import, with the engrams values the plaintext does not carry."""

    memory: MemoryPlaintext
    where: str  # "line 3", "notes/a.md:12": how the summary names it
    agent_id: str | None = None
    embedding_created_at: str | None = None


@dataclass(frozen=True)
class ImportTombstone:
    """A deletion to record (an export made with --include-deleted)."""

    memory_id: str
    deleted_at: str
    where: str


@dataclass(frozen=True)
class Invalid:
    """An input that is not a memory, and why."""

    where: str
    reason: str


ImportItem = ImportMemory | ImportTombstone | Invalid


class _Link(msgspec.Struct):
    link_type: str
    target_id: str
    weight: float = 0.5


class ImportFields(msgspec.Struct):
    """A JSONL line: a full PROTOCOL §4 plaintext, the fields of `list --json`, or less
    (only `content` is required). Unknown keys (`synced`) are ignored."""

    content: str
    id: str | None = None
    layer: Layer = "episodic"
    created_at: str | None = None
    modified_at: str | None = None
    scope: str = "moment"
    content_type: str = "text"
    source: str = "user"
    privacy_level: PrivacyLevel = "cloud_first"
    context: Any = msgspec.field(default_factory=dict)
    last_retrieved: str | None = None
    occurred_at: str | None = None
    project: str | None = None
    tags: list[str] = msgspec.field(default_factory=list)
    strength: float = 1.0
    valence: float = 0.0
    retrievals: int = 0
    imagined: bool = False
    grounded: bool = False
    links: list[_Link] = msgspec.field(default_factory=list)
    embedding: list[float] | None = None
    embedding_model: str | None = None
    agent_id: str | None = None
    embedding_created_at: str | None = None


class _Probe(msgspec.Struct):
    deleted: Any = False
    id: Any = None
    deleted_at: Any = None


_decode_probe = msgspec.json.Decoder(_Probe).decode
_NOT_DELETED: Final = _Probe()
_decode_line = msgspec.json.Decoder(ImportFields).decode


# The canonical form (shared_format.timestamps.format_rfc3339), what vaults write: a shape
# check and the date's own check spare the full parse.
_CANONICAL_SHAPE: Final = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00", re.ASCII)


def _canonical(text: str, name: str) -> str:
    """`text` in the canonical RFC 3339 form; ValueError naming the field if it is not one."""
    if _CANONICAL_SHAPE.fullmatch(text):  # what vaults write: only the date needs checking
        try:
            datetime.fromisoformat(text)
        except ValueError:
            pass
        else:
            return text
    try:
        return format_rfc3339(parse_rfc3339(text))
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


def memory_from_fields(line: ImportFields, where: str, now: str) -> ImportMemory:
    """The memory a decoded line describes, normalised as a pulled memory is (PROTOCOL §4);
    ValueError names what makes it unusable."""
    if not line.content.strip():
        raise ValueError("content is empty")
    memory_id = line.id if line.id is not None else new_memory_id()
    problem = check_id(memory_id, "id")  # PROTOCOL §6 step 1: the relay's own rule
    if problem:
        raise ValueError(f"{problem}: no relay accepts it")
    created_at = line.created_at or now
    canonical_created = _canonical(created_at, "created_at")  # kept as written, but checked
    if line.modified_at is None or line.modified_at == created_at:
        modified_at = canonical_created
    else:
        modified_at = _canonical(line.modified_at, "modified_at")
    for name, value in (("strength", line.strength), ("valence", line.valence)):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number")
    if line.embedding is not None and not all(math.isfinite(v) for v in line.embedding):
        raise ValueError("embedding values must be finite numbers")
    links: list[Link] = []
    for link in line.links:
        if link.link_type not in LINK_TYPES:
            raise ValueError(f"unknown link_type {link.link_type!r}")
        if not math.isfinite(link.weight) or not link.target_id:
            raise ValueError("a link needs a target_id and a finite weight")
        links.append(Link(link.link_type, link.target_id, link.weight))  # type: ignore[arg-type]
    memory = MemoryPlaintext(
        id=memory_id,
        content=line.content,
        layer=line.layer,
        scope=line.scope,
        content_type=line.content_type,
        source=line.source if line.source in SOURCES else "system",  # VAULT §5
        privacy_level=line.privacy_level,
        context=line.context,
        created_at=created_at,
        modified_at=modified_at,
        last_retrieved=line.last_retrieved,
        occurred_at=line.occurred_at,
        project=line.project,
        tags=line.tags,
        strength=_clamp(line.strength, STRENGTH_RANGE),
        valence=_clamp(line.valence, VALENCE_RANGE),
        retrievals=line.retrievals,
        imagined=line.imagined,
        grounded=line.grounded,
        links=links,
        embedding=line.embedding,
        embedding_model=line.embedding_model,
    )
    return ImportMemory(memory, where, line.agent_id, line.embedding_created_at)


def parse_jsonl_line(raw: bytes, where: str, now: str) -> ImportItem | None:
    """One JSONL line as an import item; None for a blank line."""
    if not raw.strip():
        return None
    try:
        # only a line with the key "deleted" (spelled out, or with a \u escape in it) can be
        # a deletion: the others skip the probe's decode
        maybe = b'"deleted"' in raw or b"\\u" in raw
        probe = _decode_probe(raw) if maybe else _NOT_DELETED
        if probe.deleted is True:
            if not isinstance(probe.id, str):
                return Invalid(where, "a deletion needs an id")
            problem = check_id(probe.id, "id")  # PROTOCOL §6 step 1
            if problem:
                return Invalid(where, f"{problem}: no relay accepts it")
            stamp = probe.deleted_at if isinstance(probe.deleted_at, str) else now
            return ImportTombstone(probe.id, _canonical(stamp, "deleted_at"), where)
        return memory_from_fields(_decode_line(raw), where, now)
    except (msgspec.DecodeError, ValueError) as exc:
        return Invalid(where, str(exc))
    except RecursionError:
        return Invalid(where, "JSON nested too deeply")


@dataclass(frozen=True)
class LineTooLong:
    """A line longer than the cap, read past without keeping it."""

    size: int  # its bytes, the newline not counted
    limit: int


def bounded_lines(handle: IO[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[bytes | LineTooLong]:
    """The lines of `handle` (newline kept), each read holding at most `limit` + 1 bytes: a
    longer line is read past in chunks of 1 MiB and comes as a LineTooLong (issue 31)."""
    while True:
        line = handle.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or line.endswith(b"\n"):
            yield line
            continue
        size, rest = len(line), line
        while rest and not rest.endswith(b"\n"):
            rest = handle.readline(_SKIP_CHUNK)
            size += len(rest)
        yield LineTooLong(size - rest.endswith(b"\n"), limit)


def jsonl_items(lines: Iterable[bytes | LineTooLong], first_line: int = 1) -> Iterator[ImportItem]:
    """Import items of JSONL input, numbered from `first_line`."""
    now = utc_now_rfc3339()
    for number, raw in enumerate(lines, start=first_line):
        if isinstance(raw, LineTooLong):
            yield Invalid(
                f"line {number}",
                f"{raw.size} bytes, longer than the {raw.limit} a line may have: skipped",
            )
            continue
        item = parse_jsonl_line(raw, f"line {number}", now)
        if item is not None:
            yield item


def vault_items(conn: sqlite3.Connection) -> Iterator[ImportItem]:
    """Every memory of another open vault, as its export would give them."""
    now = utc_now_rfc3339()
    for number, line in enumerate(export_lines(conn), start=1):
        item = parse_jsonl_line(line.encode("utf-8"), f"memory {number}", now)
        if item is not None:
            yield item


# --- the import ------------------------------------------------------------------------------


@dataclass
class ImportSummary:
    """What an import did (or, dry, would do)."""

    added: int = 0
    duplicates: int = 0
    deletions: int = 0  # tombstones recorded
    invalid: list[Invalid] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The summary as `import --json` prints it."""
        return {
            "added": self.added,
            "duplicates": self.duplicates,
            "deletions": self.deletions,
            "invalid": [{"where": i.where, "reason": i.reason} for i in self.invalid],
        }


_INSERT_ENGRAM: Final = (
    "INSERT INTO engrams (rowid, id, layer, source, privacy_level, content, context, strength,"
    " valence, retrievals, imagined, grounded, created_at, last_retrieved, project, tags,"
    " content_hash, scope, content_type, occurred_at, modified_at, synced_at, agent_id)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)"
)
# VAULT §3: the full-text row is written by code, with the engram's rowid: the batch's
# rows (its rowids are consecutive) copied by one statement instead of one bound per row.
_INSERT_FTS: Final = (
    "INSERT INTO engrams_fts (rowid, id, content)"
    " SELECT rowid, id, content FROM engrams WHERE rowid BETWEEN ? AND ? ORDER BY rowid"
)
_INSERT_EMBEDDING: Final = (
    "INSERT OR REPLACE INTO engram_embeddings (engram_id, embedding, model, dimensions,"
    " created_at) VALUES (?, ?, ?, ?, ?)"
)
_INSERT_PENDING_LINK: Final = (
    "INSERT OR REPLACE INTO sync_pending_links (source_id, target_id, link_type, weight)"
    " VALUES (?, ?, ?, ?)"
)
_encode_json = msgspec.json.Encoder().encode


class Importer:
    """Feeds items into a vault in batches of `batch` memories, one transaction each.

    `begin`/`commit` are the vault's transaction statements (the caller's connection is in
    autocommit mode). With `dry_run` nothing is written; the summary is the same.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        dry_run: bool = False,
        keep_duplicates: bool = False,
        batch: int = DEFAULT_BATCH,
    ) -> None:
        self.conn = conn
        self.dry_run = dry_run
        self.keep_duplicates = keep_duplicates
        self.batch = max(1, batch)
        self.summary = ImportSummary()
        self._ids: set[str] = {row[0] for row in conn.execute("SELECT id FROM engrams")}
        self._hashes: dict[str, str] = {}  # content hash -> the id that has it
        # a memory skipped for its content -> the id it duplicates: links to it go there
        self._aliases: dict[str, str] = {}
        if not keep_duplicates:
            for memory_id, stored, content in conn.execute(
                "SELECT id, content_hash, content FROM engrams"
            ):
                self._hashes.setdefault(stored or normalized_hash(content), memory_id)
        self._tombstones: set[str] = {row[0] for row in conn.execute("SELECT id FROM tombstones")}
        self._pending: list[tuple[ImportMemory, str]] = []
        self._linked = False  # whether this import wrote a pending link
        self._pending_tombs: list[ImportTombstone] = []
        self._tag_texts: dict[tuple[str, ...], str] = {}  # _tags_text's encodings

    def feed(self, item: ImportItem) -> None:
        """Classify one item; a full batch is written at once."""
        if isinstance(item, Invalid):
            self.summary.invalid.append(item)
            return
        if isinstance(item, ImportTombstone):
            self._feed_tombstone(item)
            return
        memory = item.memory
        digest = normalized_hash(memory.content)
        same = None if self.keep_duplicates else self._hashes.get(digest)
        if memory.id in self._ids or same is not None:
            if same is not None and memory.id not in self._ids:
                self._aliases[memory.id] = same
            self.summary.duplicates += 1
            return
        self._ids.add(memory.id)
        self._hashes.setdefault(digest, memory.id)
        self.summary.added += 1
        self._pending.append((item, digest))
        if len(self._pending) >= self.batch:
            self.flush()

    def _feed_tombstone(self, item: ImportTombstone) -> None:
        # An import only adds: a deletion is recorded for an id the vault does not hold,
        # so it reaches the relay at the next sync; a memory the vault holds is kept.
        if item.memory_id in self._ids or item.memory_id in self._tombstones:
            self.summary.duplicates += 1
            return
        self._tombstones.add(item.memory_id)
        self.summary.deletions += 1
        self._pending_tombs.append(item)

    def feed_all(self, items: Iterable[ImportItem]) -> ImportSummary:
        """Feed every item, then write what is left (bulk settings: `_bulk_settings`)."""
        with _bulk_settings(self.conn, write=not self.dry_run):
            for item in items:
                self.feed(item)
            self.flush(last=True)
        return self.summary

    def flush(self, *, last: bool = False) -> None:
        """Write the pending batch in one transaction; the `last` one also points links
        to a memory skipped as a duplicate at the memory it duplicates."""
        memories, tombs = self._pending, self._pending_tombs
        self._pending, self._pending_tombs = [], []
        relink = last and bool(self._aliases)
        if self.dry_run or (not memories and not tombs and not relink):
            return
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._write(memories, tombs)
            if relink:
                conn.executemany(
                    "UPDATE OR REPLACE sync_pending_links SET target_id = ? WHERE target_id = ?",
                    [(same, skipped) for skipped, same in self._aliases.items()],
                )
                _resolve_pending_links(conn)
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _write(
        self, memories: list[tuple[ImportMemory, str]], tombs: list[ImportTombstone]
    ) -> None:
        conn = self.conn
        # The batch's rowids are given, so its full-text rows need no lookup by id.
        first = int(conn.execute("SELECT coalesce(max(rowid), 0) + 1 FROM engrams").fetchone()[0])
        rowids = range(first, first + len(memories))
        conn.executemany(
            _INSERT_ENGRAM,
            [
                (r, *_engram_values(i, d, self._tag_texts))
                for r, (i, d) in zip(rowids, memories, strict=True)
            ],
        )
        if memories:  # one statement: the rows just written, read back inside SQLite
            conn.execute(_INSERT_FTS, (first, first + len(memories) - 1))
        ids = [(item.memory.id,) for item, _ in memories]
        revived = [row for row in ids if row[0] in self._tombstones]
        if revived:  # a memory deleted here and imported again: it is back, no deletion
            conn.executemany("DELETE FROM tombstones WHERE id = ?", revived)
        conn.executemany(
            _INSERT_EMBEDDING,
            [_embedding_values(item) for item, _ in memories if item.memory.embedding is not None],
        )
        aliases = self._aliases
        links = [
            (
                item.memory.id,
                aliases.get(link.target_id, link.target_id),
                link.link_type,
                link.weight,
            )
            for item, _ in memories
            for link in item.memory.links
        ]
        if links:
            conn.executemany(_INSERT_PENDING_LINK, links)
            self._linked = True
        if self._linked:  # a later memory may be the target of an earlier one's link
            _resolve_pending_links(conn)
        conn.executemany(
            "INSERT OR IGNORE INTO tombstones (id, deleted_at) VALUES (?, ?)",
            [(t.memory_id, t.deleted_at) for t in tombs],
        )


@contextmanager
def _bulk_settings(conn: sqlite3.Connection, *, write: bool) -> Iterator[None]:
    """Settings of this connection and process for the length of one import, restored after
    (bench figure 11 measured each):

    - a 256 MiB page cache: the batches' index inserts (random ids and content hashes)
      find their pages in memory instead of reading and decrypting them again;
    - no automatic WAL checkpoint between batches (VAULT §2: WAL), one at the end: each
      commit only appends its pages to the WAL (fsynced, as before: a batch is committed
      whole or not at all), instead of copying the WAL into the database every 1,000
      pages; a page changed by several batches is copied into the database once;
    - Python's cyclic garbage collector paused: the import allocates millions of objects
      and no cycles, and each collection walked every object the import holds."""
    cache = int(conn.execute("PRAGMA cache_size").fetchone()[0])
    checkpoint = int(conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
    collecting = gc.isenabled()
    conn.execute(f"PRAGMA cache_size = {min(cache, IMPORT_CACHE_KIB)}")
    if write:
        conn.execute("PRAGMA wal_autocheckpoint = 0")
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
        conn.execute(f"PRAGMA cache_size = {cache}")
        if write:
            conn.execute(f"PRAGMA wal_autocheckpoint = {checkpoint}")
            if not conn.in_transaction:
                # the whole WAL into the database, and the file back to zero bytes (it grew
                # by every batch); a reader still busy (5 s: VAULT §2) leaves it for later
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def _tags_text(tags: list[str], seen: dict[tuple[str, ...], str]) -> str:
    """The tags column as client._vault.store writes it (json.dumps, not ASCII-escaped),
    each distinct tag list encoded once per import (a corpus repeats its tag lists)."""
    key = tuple(tags)
    text = seen.get(key)
    if text is None:
        text = json.dumps(tags, ensure_ascii=False)
        if len(seen) < _TAG_TEXTS_KEPT:
            seen[key] = text
    return text


def _engram_values(
    item: ImportMemory, digest: str, tags: dict[tuple[str, ...], str]
) -> tuple[Any, ...]:
    m = item.memory
    return (
        m.id,
        m.layer,
        m.source,
        m.privacy_level,
        m.content,
        _encode_json(m.context).decode(),
        m.strength,
        m.valence,
        m.retrievals,
        int(m.imagined),
        int(m.grounded),
        m.created_at,
        m.last_retrieved,
        m.project,
        _tags_text(m.tags, tags),
        digest,
        m.scope,
        m.content_type,
        m.occurred_at,
        m.modified_at,
        item.agent_id,
    )


def _embedding_values(item: ImportMemory) -> tuple[Any, ...]:
    values = item.memory.embedding or []
    return (
        item.memory.id,
        struct.pack(f"<{len(values)}d", *values),  # VAULT §3: little-endian f64
        item.memory.embedding_model or DEFAULT_EMBEDDING_MODEL,
        len(values),
        item.embedding_created_at or item.memory.modified_at,
    )


def _resolve_pending_links(conn: sqlite3.Connection) -> None:
    """Links whose two ends now exist become engram_links rows; the others wait in
    sync_pending_links, as a pulled memory's do (client._vault.store)."""
    conn.execute(
        "INSERT OR REPLACE INTO engram_links (source_id, target_id, weight, link_type)"
        " SELECT p.source_id, p.target_id, p.weight, p.link_type FROM sync_pending_links p"
        " WHERE EXISTS (SELECT 1 FROM engrams WHERE id = p.source_id)"
        " AND EXISTS (SELECT 1 FROM engrams WHERE id = p.target_id)"
    )
    conn.execute(
        "DELETE FROM sync_pending_links WHERE EXISTS (SELECT 1 FROM engrams WHERE id = source_id)"
        " AND EXISTS (SELECT 1 FROM engrams WHERE id = target_id)"
    )
