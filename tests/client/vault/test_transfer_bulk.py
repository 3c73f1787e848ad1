"""The import's bulk mechanisms (client._vault.transfer, bench figure 11): the settings an
import changes for its length are restored after it, its WAL is checkpointed into the
database, every batch is committed whole, the probe for a deletion line is skipped only
when the line cannot be one, and the tags column is written as client._vault.store writes it.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from engram_sync.client._vault.transfer import (
    Importer,
    ImportMemory,
    ImportTombstone,
    Invalid,
    jsonl_items,
    parse_jsonl_line,
)
from engram_sync.shared_format.vault import open_vault
from engram_sync.shared_format.vault.store import Vault

PASSPHRASE = "transfer bulk test passphrase"
NOW = "2026-01-02T03:04:05.000006+00:00"


@pytest.fixture
def vault(tmp_path: Path) -> Iterator[Vault]:
    with open_vault(tmp_path / "vault", PASSPHRASE, create=True) as opened:
        yield opened


def _lines(count: int, start: int = 0) -> list[bytes]:
    return [
        msgspec.json.encode(
            {"id": f"mem_{i:06d}", "content": f"memory number {i}", "tags": ["a", f"t{i % 3}"]}
        )
        for i in range(start, start + count)
    ]


def _pragma(vault: Vault, name: str) -> int:
    return int(vault.conn.execute(f"PRAGMA {name}").fetchone()[0])


def test_settings_are_restored_and_the_wal_is_checkpointed(vault: Vault) -> None:
    cache, checkpoint = _pragma(vault, "cache_size"), _pragma(vault, "wal_autocheckpoint")
    assert gc.isenabled()
    seen: list[tuple[int, int, bool]] = []

    def watched() -> Iterator[ImportMemory | ImportTombstone | Invalid]:
        for item in jsonl_items(_lines(300)):
            if not seen:  # while the import runs: the bulk settings
                settings = (_pragma(vault, "cache_size"), _pragma(vault, "wal_autocheckpoint"))
                seen.append((*settings, gc.isenabled()))
            yield item

    summary = Importer(vault.conn, batch=100).feed_all(watched())
    assert summary.added == 300
    assert seen == [(-262144, 0, False)]
    assert (_pragma(vault, "cache_size"), _pragma(vault, "wal_autocheckpoint")) == (
        cache,
        checkpoint,
    )
    assert gc.isenabled()
    wal = vault.path / "engrams.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0  # TRUNCATE: all in the database
    assert vault.conn.execute("SELECT count(*) FROM engrams_fts").fetchone()[0] == 300


def test_settings_are_restored_when_an_import_fails(vault: Vault) -> None:
    cache = _pragma(vault, "cache_size")

    def failing() -> Iterator[ImportMemory | ImportTombstone | Invalid]:
        yield from jsonl_items(_lines(150))
        raise OSError("the input broke")

    importer = Importer(vault.conn, batch=100)
    with pytest.raises(OSError, match="the input broke"):
        importer.feed_all(failing())
    assert gc.isenabled()
    assert _pragma(vault, "cache_size") == cache
    assert _pragma(vault, "wal_autocheckpoint") == 1000
    # the first whole batch is committed, the 50 of the unfinished one are not
    assert vault.conn.execute("SELECT count(*) FROM engrams").fetchone()[0] == 100


def test_a_dry_run_leaves_the_checkpoint_setting_alone(vault: Vault) -> None:
    summary = Importer(vault.conn, dry_run=True).feed_all(jsonl_items(_lines(10)))
    assert summary.added == 10
    assert vault.conn.execute("SELECT count(*) FROM engrams").fetchone()[0] == 0
    assert _pragma(vault, "wal_autocheckpoint") == 1000


@pytest.mark.parametrize(
    "line",
    [
        b'{"deleted": true, "id": "mem_gone", "deleted_at": "' + NOW.encode() + b'"}',
        # the key spelled with a JSON escape is the same key: still a deletion
        b'{"del\\u0065ted": true, "id": "mem_gone", "deleted_at": "' + NOW.encode() + b'"}',
        b'{"id": "mem_gone", "deleted": true, "content": "kept text"}',
    ],
)
def test_a_deletion_line_is_a_tombstone(line: bytes) -> None:
    item = parse_jsonl_line(line, "line 1", NOW)
    assert isinstance(item, ImportTombstone)
    assert item.memory_id == "mem_gone"


@pytest.mark.parametrize(
    "line",
    [
        b'{"id": "mem_here", "content": "no deletion key at all"}',
        b'{"id": "mem_here", "content": "the word \\"deleted\\" in the text", "deleted": false}',
        b'{"id": "mem_here", "content": "caf\\u00e9"}',
    ],
)
def test_a_memory_line_is_a_memory(line: bytes) -> None:
    item = parse_jsonl_line(line, "line 1", NOW)
    assert isinstance(item, ImportMemory)
    assert item.memory.id == "mem_here"


def test_a_line_that_is_not_an_object_is_invalid() -> None:
    for raw in (b"[1, 2]", b"{not json", b'"text"'):
        item = parse_jsonl_line(raw, "line 7", NOW)
        assert isinstance(item, Invalid)
        assert item.where == "line 7"


def test_tags_are_written_as_the_store_writes_them(vault: Vault) -> None:
    tags = [["é", "b"], [], ["x"], ["é", "b"], ['quote"d', "back\\slash"]]
    lines = [
        msgspec.json.encode({"id": f"mem_t{i}", "content": f"tagged {i}", "tags": t})
        for i, t in enumerate(tags)
    ]
    Importer(vault.conn).feed_all(jsonl_items(lines))
    stored = dict(vault.conn.execute("SELECT id, tags FROM engrams"))
    assert stored == {f"mem_t{i}": json.dumps(t, ensure_ascii=False) for i, t in enumerate(tags)}
