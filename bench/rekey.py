"""Re-key (PROTOCOL §19, docs/rekey.md "Client"): M memories (and a tenth as many tombstones)
re-keyed by the real client (client._flows.rekey) through a real relay.

Measured: the whole re-key minus its one-time Argon2id derivations (the new passphrase's
sync keys and vault id, and its database key for `PRAGMA rekey`, timed apart on the same
machine), and the window from the retire's answer to this device's switch to the new vault
(the only time the device's writes are held back), and the client's own CPU time (on a
shared machine the wall time mostly measures the queue for the cores). Preparation (not
measured): a JSONL import into a SQLCipher vault and one sync to the old vault.

`python -m bench.rekey [--memories M]` runs it alone on its own database and relay.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from pathlib import Path
from typing import Any, Final

from bench.import_jsonl import write_jsonl
from engram_sync.client._flows.rekey import PUSH_CONCURRENCY, Rekey, passphrase_keys
from engram_sync.client._session import VaultSession
from engram_sync.client._vault.store import delete_memory
from engram_sync.client._vault.transfer import Importer, jsonl_items
from engram_sync.shared_format.vault.salt import vault_salt16
from engram_sync.shared_format.vault.sqlcipher_key import passphrase_vault_key

OLD_PASSPHRASE: Final = "engram bench rekey: the old passphrase"  # noqa: S105
NEW_PASSPHRASE: Final = "engram bench rekey: the new passphrase"  # noqa: S105
SECONDS_LIMIT: Final = 60.0  # issue 16: 100,000 memories re-keyed in <= 60 s, Argon2 apart
REFUSED_LIMIT: Final = 1.0  # issue 16: the old vault refusing this device's writes <= 1 s
FULL_MEMORIES: Final = 100_000


def measure(scratch: Path, relay_url: str, api_key: str, memories: int) -> dict[str, Any]:
    """One re-key of `memories` memories; its figures (see the module docstring)."""
    source = scratch / "rekey-bench.jsonl"
    write_jsonl(source, memories, seed=16)
    vault_dir = scratch / "rekey-bench-vault"
    with VaultSession.open(vault_dir, OLD_PASSPHRASE, create=True) as session:
        with source.open("rb") as handle:
            Importer(session.vault.conn).feed_all(jsonl_items(handle))
        ids = [r[0] for r in session.vault.conn.execute("SELECT id FROM engrams LIMIT ?", (
            max(1, memories // 10),
        ))]  # fmt: skip
        session.link(relay_url, api_key, f"rekey-bench-{secrets.token_hex(4)}", "bench")
        with session.relay() as relay:
            session.syncer(relay).sync()
        with session.vault.transaction() as conn:
            for memory_id in ids:
                delete_memory(conn, memory_id)
        with session.relay() as relay:
            session.syncer(relay).sync()
        argon_started = time.perf_counter()
        passphrase_keys(NEW_PASSPHRASE)
        passphrase_vault_key(NEW_PASSPHRASE, vault_salt16(vault_dir))
        argon2_s = time.perf_counter() - argon_started
        started, cpu_started = time.perf_counter(), time.process_time()
        report = Rekey(session).run(new_passphrase=NEW_PASSPHRASE, new_api_key=None)
        total_s = time.perf_counter() - started
        client_cpu_s = time.process_time() - cpu_started  # this process (the relay apart)
    if report.held != memories or report.tombstones != len(ids):
        raise RuntimeError(
            f"the re-key moved {report.held} versions ({report.tombstones} tombstones), "
            f"expected {memories} ({len(ids)})"
        )
    return {
        "memories": memories,
        "live": report.live,
        "tombstones": report.tombstones,
        "batches": report.batches,
        "push_concurrency": PUSH_CONCURRENCY,
        "total_s": total_s,
        "argon2_s": argon2_s,
        "seconds_excluding_argon2": max(0.0, total_s - argon2_s),
        "client_cpu_s": client_cpu_s,
        "copy_s": report.copy_seconds,
        "write_refused_s": report.write_refused_s,
    }


def main() -> int:
    """Run the re-key bench alone: its own embedded PostgreSQL and relay process."""
    from bench.database import BenchDatabase
    from bench.relay_process import RelayProcess

    parser = argparse.ArgumentParser(prog="python -m bench.rekey")
    parser.add_argument("--memories", type=int, default=FULL_MEMORIES)
    args = parser.parse_args()
    with BenchDatabase() as db:
        key = "bench-" + secrets.token_urlsafe(24)
        with RelayProcess(db.url, key, db.scratch / "relay.log", workers=1) as relay:
            result = measure(db.scratch, relay.url, relay.key, args.memories)
    result["seconds_limit"], result["write_refused_limit_s"] = SECONDS_LIMIT, REFUSED_LIMIT
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
