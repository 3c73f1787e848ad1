"""The page's PROTOCOL §17 decisions (web/js/restore.js), pure, run in Chromium: when a pull
page or push answer shows a restored relay (as engine._relay_restored and _push_shows_restore
decide it), and what a full re-pull leaves to push back (as store.repush_missing picks it)."""

from __future__ import annotations

from typing import Any

from tests.web.conftest import BrowserThread, open_bundle

RULES = """async () => {
  const r = await import('./js/restore.js');
  const g = 'a'.repeat(32);
  const pull = (page, known, asked) => r.pullShowsRestore(page, { known, asked });
  const push = (answer, known, cursor) => r.pushShowsRestore(answer, { known, cursor });
  const known = new Map([
    ['kept', { vector_clock: 3 }], ['lost', { vector_clock: 2 }], ['older', { vector_clock: 5 }],
    ['gone', { vector_clock: 7 }], ['gone-everywhere', { vector_clock: 4 }],
    ['gone-there', { vector_clock: 2 }], ['waiting', { vector_clock: 1 }]]);
  const memories = new Map([['kept', {}], ['lost', {}], ['older', {}], ['waiting', {}]]);
  const seen = new Map([['kept', 3], ['older', 4], ['gone', 6], ['gone-there', 2]]);
  return {
    pull: [
      pull({ generation: 'b'.repeat(32), head: 9 }, g, 2),  // another generation
      pull({ generation: g, head: 1 }, g, 2),               // head below the cursor
      pull({ generation: g, head: 2 }, g, 2),               // the same relay
      pull({ generation: 'b'.repeat(32), head: 9 }, null, 2),  // first contact
      pull({ head: 9 }, g, 2),                              // no generation sent
      pull({ generation: 7, head: 9 }, g, 2),               // not text
      pull({ generation: 'b'.repeat(257), head: 9 }, g, 2), // too long to keep
    ],
    push: [
      push({ generation: 'c'.repeat(32), cursor: 9 }, g, 2),
      push({ generation: g, cursor: 1 }, g, 2),
      push({ generation: g, cursor: 3 }, g, 2),
      push(null, g, 2),
    ],
    missing: r.missingOnRelay({ seen, known, memories,
      pending: new Map([['waiting', {}]]) }),
  };
}"""


def test_restore_rules(browser: BrowserThread, bundle_url: str) -> None:
    def steps(page: Any) -> Any:
        open_bundle(page, bundle_url)
        return page.evaluate(RULES)

    seen = browser.run(steps)
    assert seen["pull"] == [True, True, False, False, False, False, False]
    assert seen["push"] == [True, True, False, False]
    # lost: absent there; older: an older clock there; gone: a deletion over an older live
    # version there. Not: kept (the same), gone-everywhere (the relay never had it),
    # gone-there (the relay holds it at our clock), waiting (pending: pushed as pending)
    assert seen["missing"] == [
        {"id": "lost", "deleted": False},
        {"id": "older", "deleted": False},
        {"id": "gone", "deleted": True},
    ]
