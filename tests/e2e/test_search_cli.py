"""`engram-sync search` through the real executable on a real SQLCipher vault: every word,
else any word, else a substring; the filters; the stated total order (docs/search.md)."""

from __future__ import annotations

import json
from pathlib import Path

from engram_sync.client._session import VaultSession
from engram_sync.client._vault import store
from engram_sync.client._vault.search import SearchFilters, search
from tests.e2e.test_import_export_cli import PASSPHRASE, cli, ok


def _ids(vault: Path, *args: str) -> tuple[str, list[str]]:
    answer = json.loads(ok(cli(vault, "search", *args, "--json")))
    return answer["mode"], [item["id"] for item in answer["results"]]


def _vault(path: Path) -> dict[str, str]:
    with (
        VaultSession.open(path, PASSPHRASE, create=True) as session,
        session.vault.transaction() as conn,
    ):
        ids = {
            "deploy": store.add_memory(
                conn, "Deploy with make ship", tags=["ops"], project="infra"
            ),
            "lunch": store.add_memory(conn, "Lunch is at noon on Fridays", layer="semantic"),
            "rust": store.add_memory(conn, "std::mem::take swaps in the default", tags=["rust"]),
            "twice": store.add_memory(conn, "ship ship", tags=["ops"]),
            "tie_old": store.add_memory(conn, "ship it now"),
            "tie_new": store.add_memory(conn, "ship it today"),
            "tie_new2": store.add_memory(conn, "ship it later"),
        }
        for name, stamp in (
            ("tie_old", "2026-01-01T00:00:00.000000+00:00"),
            ("tie_new", "2026-06-01T00:00:00.000000+00:00"),
            ("tie_new2", "2026-06-01T00:00:00.000000+00:00"),
        ):
            conn.execute("UPDATE engrams SET modified_at = ? WHERE id = ?", (stamp, ids[name]))
    return ids


def test_all_words_then_any_then_substring(tmp_path: Path) -> None:
    vault = tmp_path / "v"
    ids = _vault(vault)
    assert _ids(vault, "make deploy") == ("all", [ids["deploy"]])  # every word, any order
    # no memory has both words: any of them will do
    mode, found = _ids(vault, "deploy lunch")
    assert mode == "any"
    assert set(found) == {ids["deploy"], ids["lunch"]}
    # FTS syntax is plain text: `AND`, quotes, `*`, `:` find nothing rather than erroring
    assert _ids(vault, 'AND "(* content:') == ("any", [])
    # only punctuation: no word the index can match, so the text is searched as written
    assert _ids(vault, "::") == ("substring", [ids["rust"]])
    text = cli(vault, "search", "deploy lunch")
    assert "no memory has every word" in ok(text) + text.stderr
    assert ids["deploy"] in text.stdout
    none = cli(vault, "search", "nothing-like-this")
    assert ok(none) == ""
    assert "no memory matches" in none.stderr
    empty = cli(vault, "search", "  ")
    assert empty.returncode == 1
    assert "the query is empty" in empty.stderr


def test_results_in_the_stated_total_order(tmp_path: Path) -> None:
    vault = tmp_path / "v"
    ids = _vault(vault)
    mode, found = _ids(vault, "ship")
    assert mode == "all"
    # bm25 first: "ship ship" (the word twice, short) ranks best; the three "ship it …"
    # memories tie on rank, so the most recently modified come first, then by id
    ties = [*sorted([ids["tie_new"], ids["tie_new2"]]), ids["tie_old"]]
    assert found[0] == ids["twice"]
    assert [i for i in found if i in ties] == ties
    assert found.index(ids["tie_old"]) > found.index(ids["tie_new"])
    assert _ids(vault, "ship", "--limit", "2")[1] == found[:2]


def test_filters_narrow_the_search(tmp_path: Path) -> None:
    vault = tmp_path / "v"
    ids = _vault(vault)
    assert _ids(vault, "ship", "--tag", "ops")[1] == [ids["twice"], ids["deploy"]]
    assert _ids(vault, "ship", "--tag", "ops", "--project", "infra")[1] == [ids["deploy"]]
    assert _ids(vault, "ship", "--tag", "ops", "--tag", "rust")[1] == []  # every tag given
    assert _ids(vault, "noon", "--layer", "semantic")[1] == [ids["lunch"]]
    assert _ids(vault, "noon", "--layer", "episodic")[1] == []
    # the OR step keeps the filters too
    assert _ids(vault, "lunch deploy", "--layer", "semantic") == ("any", [ids["lunch"]])
    bad = cli(vault, "search", "x", "--layer", "dream")
    assert bad.returncode == 1
    assert "--layer must be one of" in bad.stderr


def test_a_damaged_index_falls_back_to_a_substring_search(tmp_path: Path) -> None:
    """Internal: the index refusing a query (here: gone) is what the fallback is for."""
    with VaultSession.open(tmp_path / "v", PASSPHRASE, create=True) as session:
        conn = session.vault.conn
        with session.vault.transaction():
            kept = store.add_memory(conn, "Deploy with make ship")
        assert search(conn, "make ship").mode == "all"
        conn.execute("DROP TABLE engrams_fts")
        result = search(conn, "MAKE ship", filters=SearchFilters(layer="episodic"))
        assert (result.mode, [m.id for m in result.memories]) == ("substring", [kept])
