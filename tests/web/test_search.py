"""The page's search (web/js/search.js) answers as `engram-sync search` does over the same
memories (docs/search.md): the same mode (all, any, substring) and the same ids in the same
order, for queries where the AND, OR and substring steps, bm25 and the recency tie-break
decide; filters by tag, project and layer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from engram_sync.client import Vault
from engram_sync.client._vault.search import SearchFilters, search
from tests.web.conftest import BrowserThread, open_bundle

MEMORIES = [
    ("apple apple", [], None, "episodic"),  # oldest, and bm25's best for "apple"
    ("apple pie recipe with apples", ["food"], "kitchen", "episodic"),
    ("Apple released a new phone", ["tech"], None, "semantic"),
    ("a short note about pie", ["food"], "kitchen", "episodic"),
    ("apple apple apple orchard visit in autumn with friends and family", [], None, "episodic"),
    ("the relay stores ciphertext only; keys stay on devices", ["tech"], "engram", "semantic"),
    ("Café au lait, naïve résumé", [], None, "episodic"),
    ("ratio 3:1 and the path a/b::c", [], None, "semantic"),
    ("well-known multi-word phrase test", [], None, "episodic"),
    # newest, and bm25's worst for "apple": recency alone would put it first
    (
        "a long entry naming apple once among words on gardens, weather, time and tea",
        [],
        None,
        "episodic",
    ),
]
QUERIES: list[tuple[str, dict[str, Any]]] = [
    ("apple", {}), ("apple pie", {}), ("pie orchard", {}), ("APPLE", {}),
    ("cafe resume", {}), ("::", {}), ("a/b", {}), ("well-known", {}), ("known well", {}),
    ("nothing-matches-this", {}), ("pie", {"tags": ["food"]}), ("apple", {"layer": "semantic"}),
    ("apple", {"project": "kitchen"}), ("ciphertext keys", {"tags": ["tech", "food"]}),
]  # fmt: skip

SEARCH = """async ([memories, queries]) => {
  const { SearchIndex } = await import('./js/search.js');
  const index = new SearchIndex(memories);
  return queries.map(([q, f]) => {
    const { mode, results } = index.search(q, f);
    return [mode, results.map((m) => m.id)];
  });
}"""


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vault]:
    path = tmp_path_factory.mktemp("search") / "vault"
    with Vault.open(path, "search correct horse battery staple", create=True) as opened:
        for content, tags, project, layer in MEMORIES:
            opened.add(content, tags=tags, project=project, layer=layer)  # type: ignore[arg-type]
        yield opened


def test_the_page_finds_what_the_cli_finds_in_the_same_order(
    browser: BrowserThread, bundle_url: str, vault: Vault
) -> None:
    memories = msgspec.to_builtins(vault.list())
    expected = []
    for query, filters in QUERIES:
        chosen = SearchFilters(
            tuple(filters.get("tags", ())), filters.get("project"), filters.get("layer")
        )
        found = search(vault._session.vault.conn, query, filters=chosen)
        expected.append([found.mode, [m.id for m in found.memories]])
    got = browser.run(
        lambda page: open_bundle(page, bundle_url).evaluate(SEARCH, [memories, QUERIES])
    )
    for (query, filters), want, answer in zip(QUERIES, expected, got, strict=True):
        assert answer == want, f"{query!r} {filters}"
