"""JSONL import (issue 17): M memories, one PROTOCOL §4 plaintext per line, imported into a
fresh SQLCipher vault by the code `engram-sync import FILE` runs (client._vault.transfer:
parse, dedupe by content hash, batches of DEFAULT_BATCH per transaction, full-text rows,
the import's bulk settings and its final WAL checkpoint); the row also gives the import's
own CPU time (on a shared machine the wall time mostly measures the queue for the cores)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, Final

import msgspec

from bench.corpus import memory_plaintext
from engram_sync.client._session import VaultSession
from engram_sync.client._vault.store import new_memory_id
from engram_sync.client._vault.transfer import DEFAULT_BATCH, Importer, jsonl_items
from engram_sync.shared_format.plaintext import encode_memory
from engram_sync.shared_format.timestamps import utc_now_rfc3339

PASSPHRASE: Final = "engram bench import passphrase: correct horse battery staple"  # noqa: S105


def write_jsonl(path: Path, count: int, seed: int = 17) -> int:
    """`count` distinct memories as JSONL at `path`; returns the file's size in bytes."""
    rng = random.Random(seed)  # noqa: S311 - a corpus, not a secret
    with path.open("w", encoding="utf-8") as handle:
        for index in range(count):
            memory = memory_plaintext(rng, new_memory_id(), utc_now_rfc3339())
            # distinct content: the import skips a memory whose content hash it has seen
            distinct = msgspec.structs.replace(memory, content=f"{memory.content} (note {index})")
            handle.write(encode_memory(distinct) + "\n")
    return path.stat().st_size


def measure(scratch: Path, count: int) -> dict[str, Any]:
    """Import `count` memories from a JSONL file; seconds and memories/s, vault open apart."""
    source = scratch / "import-bench.jsonl"
    size = write_jsonl(source, count)
    vault_dir = scratch / "import-bench-vault"
    with VaultSession.open(vault_dir, PASSPHRASE, create=True) as session:
        conn = session.vault.conn
        started, cpu_started = time.perf_counter(), time.process_time()
        with source.open("rb") as handle:
            summary = Importer(conn).feed_all(jsonl_items(handle))
        seconds = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_started
        stored = int(conn.execute("SELECT count(*) FROM engrams").fetchone()[0])
        indexed = int(conn.execute("SELECT count(*) FROM engrams_fts").fetchone()[0])
    if summary.added != count or stored != count or indexed != count:
        raise RuntimeError(
            f"import stored {stored} memories ({indexed} indexed, {summary.added} added, "
            f"{len(summary.invalid)} invalid), expected {count}"
        )
    return {
        "memories": count,
        "file_bytes": size,
        "batch": DEFAULT_BATCH,
        "seconds": seconds,
        "memories_per_s": count / seconds,
        "cpu_s": cpu_s,
        "memories_per_cpu_s": count / cpu_s if cpu_s > 0 else float("inf"),
    }
