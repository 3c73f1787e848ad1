"""The client's own tables in the vault database: one owner, a version, ordered migrations.

The Engram tables and their `PRAGMA user_version` (VAULT §3) belong to the vault
format and are applied by `shared_format.vault`; this module never touches them.
The sync tables added by this project (never pushed) are versioned separately in
the one-row table `sync_schema`, and `migrate` brings a vault up to
`SCHEMA_VERSION` when a session opens it (client._session). `sync_conflicts`
stays with the vault schema (shared_format.vault.schema), which creates it.

Migration 1 is the tables exactly as they were created before this module
existed, with IF NOT EXISTS, so a vault that already has them (and no
`sync_schema`) is recorded as version 1 with its rows kept. A later change is a
new entry appended to MIGRATIONS, never an edit of an old one.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from .._errors import SyncError

SCHEMA_TABLE: Final = "sync_schema"

_CREATE_SCHEMA_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS sync_schema ("
    " id INTEGER PRIMARY KEY CHECK (id = 1),"
    " version INTEGER NOT NULL)"
)

_MIGRATION_1: Final = (
    # PROTOCOL §8 `known_clocks`: the highest version this device applied or pushed.
    """CREATE TABLE IF NOT EXISTS sync_known_clocks (
        memory_id TEXT PRIMARY KEY,
        vector_clock INTEGER NOT NULL,
        device_id TEXT NOT NULL,
        created_at TEXT NOT NULL
    )""",
    # Links whose target has not arrived yet (engram_links.target_id must reference a row).
    """CREATE TABLE IF NOT EXISTS sync_pending_links (
        source_id TEXT NOT NULL,
        target_id TEXT NOT NULL,
        link_type TEXT NOT NULL,
        weight REAL NOT NULL,
        PRIMARY KEY (source_id, target_id)
    )""",
    # The vault key K this device holds (client._vault.vault_key_store), and a vault awaiting one.
    """CREATE TABLE IF NOT EXISTS sync_vault_key (
        vault_id TEXT PRIMARY KEY,
        k BLOB NOT NULL,
        source TEXT NOT NULL,
        stored_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS sync_vault_key_expected (
        vault_id TEXT PRIMARY KEY,
        source TEXT NOT NULL,
        since TEXT NOT NULL
    )""",
    # An open team handoff request (client._accounts.team): its ephemeral P-256 private key
    # (PKCS8 DER).
    """CREATE TABLE IF NOT EXISTS sync_handoff_request (
        request_id TEXT PRIMARY KEY,
        server_url TEXT NOT NULL,
        vault_id TEXT NOT NULL,
        private_key BLOB NOT NULL,
        fingerprint TEXT NOT NULL,
        label TEXT NOT NULL,
        created_at TEXT NOT NULL,
        expires_at TEXT NOT NULL
    )""",
    # PROTOCOL §14 step 4: the requester's SPAKE2 state (client._accounts.team), secret like
    # the key.
    """CREATE TABLE IF NOT EXISTS sync_handoff_pake (
        request_id TEXT PRIMARY KEY,
        pairing_id TEXT NOT NULL,
        state BLOB NOT NULL
    )""",
    # PROTOCOL §14 step 4: whole pairing codes (client._accounts.pairing); `keep_until` is
    # unix time.
    """CREATE TABLE IF NOT EXISTS sync_pairing_code (
        pairing_id TEXT NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('admin', 'requester')),
        server_url TEXT NOT NULL,
        vault_id TEXT NOT NULL,
        code TEXT NOT NULL,
        created_at TEXT NOT NULL,
        keep_until REAL NOT NULL,
        PRIMARY KEY (pairing_id, role)
    )""",
)

_MIGRATION_2: Final = (
    # PROTOCOL §18 (docs/digest.md): tombstones the relay showed as compacted (its bucket
    # list lacks them), at the clock it lacked; left out of this device's digest while
    # the known clock of the memory is still that one. The known clock itself stays (LWW).
    """CREATE TABLE IF NOT EXISTS sync_digest_compacted (
        memory_id TEXT PRIMARY KEY,
        vector_clock INTEGER NOT NULL
    )""",
)

_MIGRATION_3: Final = (
    # PROTOCOL §8 "strict_local never leaves the device" (docs/privacy.md): a strict_local
    # memory deleted on this device only (no tombstone is pushed; a pulled version of it is
    # kept as a conflict copy, not applied)
    """CREATE TABLE IF NOT EXISTS sync_local_deletions (
        memory_id TEXT PRIMARY KEY,
        deleted_at TEXT NOT NULL
    )""",
    # the relay's version of a memory this device keeps local is a deletion at this clock
    # (`engram-sync retract`, or another device's tombstone kept out); NULL: a retraction
    # not pushed yet
    """CREATE TABLE IF NOT EXISTS sync_retractions (
        memory_id TEXT PRIMARY KEY,
        vector_clock INTEGER
    )""",
)

_MIGRATION_4: Final = (
    # docs/history.md: every version this device replaced (a local edit or deletion, a pulled
    # version or deletion, a restore, a revert), never synced. The engrams columns of the
    # replaced version (NULL when it was a deletion), its links as JSON and its embedding;
    # `written_*` who wrote the replaced version, `new_*` who wrote the one that replaced it.
    # `version` numbers a memory's versions on this device from 1 (pruning never renumbers).
    # `capped`: counted against the size cap (0: a memory's last version before a deletion,
    # kept for the retention days only).
    """CREATE TABLE IF NOT EXISTS sync_history (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        memory_id TEXT NOT NULL,
        version INTEGER NOT NULL,
        deleted INTEGER NOT NULL,
        layer TEXT, source TEXT, privacy_level TEXT, content TEXT, context TEXT,
        strength REAL, valence REAL, retrievals INTEGER, imagined INTEGER, grounded INTEGER,
        created_at TEXT, last_retrieved TEXT, project TEXT, tags TEXT, scope TEXT,
        content_type TEXT, occurred_at TEXT, modified_at TEXT,
        links TEXT, embedding BLOB, embedding_model TEXT,
        written_by TEXT, written_label TEXT, written_source TEXT, written_tool TEXT,
        written_at TEXT,
        new_by TEXT, new_label TEXT, new_source TEXT, new_tool TEXT, new_at TEXT,
        new_modified_at TEXT,
        replaced_at TEXT NOT NULL,
        reason TEXT NOT NULL,
        size INTEGER NOT NULL,
        capped INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS sync_history_memory ON sync_history (memory_id, seq)",
    "CREATE INDEX IF NOT EXISTS sync_history_capped ON sync_history (seq) WHERE capped = 1",
    # the retention settings and the running totals pruning needs (one row)
    """CREATE TABLE IF NOT EXISTS sync_history_meta (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        capped_bytes INTEGER NOT NULL DEFAULT 0,
        horizon TEXT,
        keep_days REAL NOT NULL DEFAULT 30,
        max_percent REAL NOT NULL DEFAULT 10,
        min_bytes INTEGER NOT NULL DEFAULT 1048576
    )""",
    "INSERT OR IGNORE INTO sync_history_meta (id) VALUES (1)",
)

# issue 36 (PROTOCOL §18, docs/digest.md "Kept on the device"): the device's digest is kept,
# not recomputed at every check. What a memory's held version is depends on these tables
# (client._vault.held_versions), by the column naming the memory:
_HELD_SOURCES: Final = (
    ("sync_known_clocks", "memory_id", ("INSERT", "UPDATE", "DELETE")),
    ("engrams", "id", ("INSERT", "DELETE")),
    ("tombstones", "id", ("INSERT", "DELETE")),
    ("sync_local_deletions", "memory_id", ("INSERT", "UPDATE", "DELETE")),
    ("sync_retractions", "memory_id", ("INSERT", "UPDATE", "DELETE")),
    ("sync_digest_compacted", "memory_id", ("INSERT", "UPDATE", "DELETE")),
)


def _noting_triggers() -> tuple[str, ...]:
    """Before a memory's first change since the kept digest was last folded, note the
    version it held then (none: not held), in the statement's own transaction, whoever
    writes: the triggers live in the database (client._vault.kept_digest). No OR IGNORE in
    the body: an outer INSERT OR REPLACE would turn it into a replace (SQLite applies the
    outer statement's conflict clause to a trigger's statements)."""
    statements = []
    for table, column, events in _HELD_SOURCES:
        for event in events:
            row = "NEW" if event == "INSERT" else "OLD"
            memory = f"{row}.{column}"
            # a memory with no known clock holds no version before or after a change of
            # another table (an import, a new local memory): nothing to note
            known = (
                ""
                if table == "sync_known_clocks"
                else f" EXISTS (SELECT 1 FROM sync_known_clocks WHERE memory_id = {memory}) AND"  # noqa: S608
            )
            statements.append(
                f"CREATE TRIGGER IF NOT EXISTS sync_digest_note_{table}_{event.lower()}"  # noqa: S608 - identifiers from _HELD_SOURCES
                f" BEFORE {event} ON {table} WHEN{known}"
                f" NOT EXISTS (SELECT 1 FROM sync_digest_dirty WHERE memory_id = {memory})"
                " BEGIN"
                " INSERT INTO sync_digest_dirty (memory_id, device_id, vector_clock, deleted)"
                " SELECT memory_id, device_id, vector_clock, deleted FROM sync_digest_versions"
                f" WHERE memory_id = {memory} AND held;"
                f" INSERT INTO sync_digest_dirty (memory_id) SELECT {memory} WHERE NOT EXISTS"
                f" (SELECT 1 FROM sync_digest_dirty WHERE memory_id = {memory});"
                " END"
            )
    return tuple(statements)


_MIGRATION_5: Final = (
    # the kept digest: XOR of the held versions' hashes and how many (one row; missing:
    # recomputed at the next check)
    """CREATE TABLE IF NOT EXISTS sync_digest (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        digest BLOB NOT NULL,
        count INTEGER NOT NULL
    )""",
    # memories whose held version may have changed since the last fold, with the version
    # they held then (device_id NULL: none); WITHOUT ROWID: one b-tree written, not two
    """CREATE TABLE IF NOT EXISTS sync_digest_dirty (
        memory_id TEXT PRIMARY KEY,
        device_id TEXT,
        vector_clock INTEGER,
        deleted INTEGER
    ) WITHOUT ROWID""",
    # every memory's held version (client._vault.held_versions `_HELD`, in one view);
    # `held` = 0 for a tombstone the relay compacted at that clock
    """CREATE VIEW IF NOT EXISTS sync_digest_versions AS SELECT
        k.memory_id AS memory_id, k.device_id AS device_id, k.vector_clock AS vector_clock,
        ((e.id IS NULL AND t.id IS NULL AND d.memory_id IS NULL)
         OR coalesce(r.vector_clock = k.vector_clock, 0)) AS deleted,
        NOT (((e.id IS NULL AND t.id IS NULL AND d.memory_id IS NULL)
              OR coalesce(r.vector_clock = k.vector_clock, 0))
             AND coalesce(c.vector_clock = k.vector_clock, 0)) AS held
        FROM sync_known_clocks k
        LEFT JOIN engrams e ON e.id = k.memory_id
        LEFT JOIN tombstones t ON t.id = k.memory_id
        LEFT JOIN sync_local_deletions d ON d.memory_id = k.memory_id
        LEFT JOIN sync_retractions r ON r.memory_id = k.memory_id
        LEFT JOIN sync_digest_compacted c ON c.memory_id = k.memory_id""",
    *_noting_triggers(),
    # a vault that holds no version yet starts at the empty digest (a vault that does is
    # folded from its rows at the next check)
    "INSERT OR IGNORE INTO sync_digest (id, digest, count)"
    " SELECT 1, zeroblob(32), 0 WHERE NOT EXISTS (SELECT 1 FROM sync_known_clocks)",
    # PROTOCOL §8: the rows to push come from this index (client._vault.store.push_keys),
    # not a scan of engrams; its WHERE is store.NEEDS_PUSH, word for word
    "CREATE INDEX IF NOT EXISTS sync_push_pending ON engrams (coalesce(modified_at, ''), id)"
    " WHERE (privacy_level <> 'strict_local' AND (synced_at IS NULL OR modified_at > synced_at))",
)

_MIGRATION_6: Final = (
    # PROTOCOL §8 strict_local: a `sync_conflicts` row (Engram's table) that holds a pulled
    # version kept out of a memory this device keeps local, not a local version that lost
    # (client._sync.strict_local.kept_out); `conflicts` says which
    """CREATE TABLE IF NOT EXISTS sync_kept_out (
        conflict_id INTEGER PRIMARY KEY
    )""",
)

# MIGRATIONS[n - 1] takes the sync schema from version n - 1 to n. Append only.
MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    _MIGRATION_1,
    _MIGRATION_2,
    _MIGRATION_3,
    _MIGRATION_4,
    _MIGRATION_5,
    _MIGRATION_6,
)
SCHEMA_VERSION: Final = len(MIGRATIONS)


class LocalSchemaTooNewError(SyncError):
    """The vault's sync tables were written by a newer engram-sync than this one."""


def schema_version(conn: sqlite3.Connection) -> int:
    """The vault's sync schema version; 0 for a vault without `sync_schema`."""
    has_table = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (SCHEMA_TABLE,)
    ).fetchone()
    if has_table is None:
        return 0
    row = conn.execute("SELECT version FROM sync_schema WHERE id = 1").fetchone()
    return 0 if row is None else int(row[0])


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the vault's sync tables to SCHEMA_VERSION in one transaction; the version.

    `conn` is an open vault connection in autocommit mode and not in a transaction
    (as `shared_format.vault.open_vault` returns it); its settings, row factory
    included, are left as they are. A vault whose version is newer than this code
    knows is refused with LocalSchemaTooNewError and left unchanged.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = schema_version(conn)
        if version > SCHEMA_VERSION:
            raise LocalSchemaTooNewError(
                f"this vault's sync tables are at version {version}, newer than this "
                f"engram-sync knows ({SCHEMA_VERSION}): upgrade engram-sync"
            )
        if version < SCHEMA_VERSION:
            conn.execute(_CREATE_SCHEMA_TABLE)
            for statements in MIGRATIONS[version:]:
                for statement in statements:
                    conn.execute(statement)
            conn.execute(
                "INSERT INTO sync_schema (id, version) VALUES (1, ?)"
                " ON CONFLICT (id) DO UPDATE SET version = excluded.version",
                (SCHEMA_VERSION,),
            )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return SCHEMA_VERSION
