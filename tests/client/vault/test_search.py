"""client._vault.search's best-ranked window (internal): the ids it answers are the whole
ordered join's (bm25 rank, then the most recently modified, then the id; with the
filters), on a real SQLCipher vault built to be hard for a window: long runs of equal
ranks, equal modification times, filters that keep few matches. docs/search.md states the
order; tests/e2e/test_search_cli.py holds the command to it."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from engram_sync.client._session import VaultSession
from engram_sync.client._vault import store
from engram_sync.client._vault.search import _ORDER, SearchFilters, _fts_ids

PASSPHRASE = "search window correct horse battery staple"
WORDS = ("ship", "deploy", "release", "rollback", "notes", "friday")
STAMPS = [f"2026-0{month}-01T00:00:00.000000+00:00" for month in range(1, 4)]


def _whole_join(
    conn: sqlite3.Connection, match: str, filters: SearchFilters, limit: int
) -> list[str]:
    where, params = filters.sql()
    rows = conn.execute(
        "SELECT e.id FROM engrams_fts f JOIN engrams e ON e.id = f.id"
        f" WHERE engrams_fts MATCH ?{where} ORDER BY f.rank, {_ORDER} LIMIT ?",
        (match, *params, limit),
    ).fetchall()
    return [str(row[0]) for row in rows]


def test_the_window_answers_what_the_whole_join_answers(tmp_path: Path) -> None:
    rng = random.Random(7)
    with VaultSession.open(tmp_path / "v", PASSPHRASE, create=True) as session:
        with session.vault.transaction() as conn:
            for _ in range(1_500):
                # three words of six, mostly: many memories of equal length and frequency
                # rank equal; a few repeat a word or run longer and rank apart
                words = rng.choices(WORDS, k=rng.choice((3, 3, 3, 4, 6)))
                tags = rng.sample(("ops", "bug", "todo"), rng.randint(0, 2))
                project = rng.choice((None, "infra", "rare" if rng.random() < 0.02 else None))
                layer = rng.choice(("episodic", "semantic"))
                memory_id = store.add_memory(
                    conn, " ".join(words), tags=tags, project=project, layer=layer
                )
                conn.execute(
                    "UPDATE engrams SET modified_at = ? WHERE id = ?",
                    (rng.choice(STAMPS), memory_id),
                )
        conn = session.vault.conn
        filters = [
            SearchFilters(),
            SearchFilters(tags=("ops",)),
            SearchFilters(project="infra", layer="semantic"),
            SearchFilters(project="rare"),  # a handful of matches: past every window
            SearchFilters(project="none-such"),
        ]
        checked = 0
        for match in ('"ship"', 'content:("ship" "deploy")', 'content:("notes" OR "friday")'):
            for chosen in filters:
                for limit in (1, 3, 10, 100):
                    assert _fts_ids(conn, match, chosen, limit) == _whole_join(
                        conn, match, chosen, limit
                    ), (match, chosen, limit)
                    checked += 1
        assert checked == 60
