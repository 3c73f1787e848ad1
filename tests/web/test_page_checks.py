"""The page refuses what the Python client refuses (issue 34; PROTOCOL §3, §9; the Python
client's check_page): a forged cursor page is refused whole, reported, and nothing of it is
applied; a blob that fails its HMAC is skipped and reported, never applied, never raising the
clock. The relay here is a stub object in the page answering pages the test writes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.padding import pad_plaintext
from engram_sync.shared_format.plaintext import tombstone_plaintext
from engram_sync.shared_format.sync_keys import derive_sync_keys
from engram_sync.shared_format.wire import encode_json
from tests.shared_format.conftest import GOLDEN_PASSPHRASE
from tests.web.conftest import BrowserThread, open_bundle

# A WebVault over a relay stub answering `arg.pages` in turn; the pull's outcome.
PULL = """async ([passphrase, pages]) => {
  const kdf = await import('./js/kdf.js');
  const { WebVault } = await import('./js/vault.js');
  const keys = await kdf.deriveSyncKeys(passphrase);
  const { RelayError } = await import('./js/relay.js');
  let turn = 0;
  const relay = { pull: async () => {
    const next = structuredClone(pages[turn++]);
    if (next === 'resync') throw new RelayError(409, 'resync_required', 'compacted');
    return next;
  } };
  const vault = new WebVault({ keys, relay, vaultId: 'team-web', relayName: 'stub',
    label: 'test' });
  let error = null;
  try { await vault.pull(); } catch (e) { error = [e.constructor.name, e.message]; }
  return { error, cursor: vault.cursor, clock: vault.clock, ids: [...vault.memories.keys()],
    refused: vault.refused, skipped: vault.skipped.map((s) => s.reason) };
}"""


@pytest.fixture(scope="module")
def blobs() -> list[dict[str, Any]]:
    """Two tombstones under the golden keys (the page reads them as deletions of nothing)
    and a live memory, as wire dicts."""
    cipher = BlobCipher(derive_sync_keys(GOLDEN_PASSPHRASE))
    made = [
        cipher.seal(
            pad_plaintext(
                f'{{"content":"c{n}","created_at":"2026-08-30T12:00:00+00:00","id":"mem_{n}",'
                '"layer":"semantic"}'
            ),
            vault_id="team-web", memory_id=f"mem_{n}", device_id="py", vector_clock=n,
            deleted=False,
        )
        for n in (1, 2)
    ]  # fmt: skip
    made.append(
        cipher.seal(
            pad_plaintext(tombstone_plaintext("mem_9")), vault_id="team-web",
            memory_id="mem_9", device_id="py", vector_clock=3, deleted=True,
        )
    )  # fmt: skip
    return [dict(json.loads(encode_json(b)), seq=i + 1) for i, b in enumerate(made)]


def pull(browser: BrowserThread, url: str, pages: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = browser.run(
        lambda page: open_bundle(page, url).evaluate(PULL, [GOLDEN_PASSPHRASE, pages])
    )
    return result


def test_an_honest_page_applies(
    browser: BrowserThread, bundle_url: str, blobs: list[dict[str, Any]]
) -> None:
    result = pull(browser, bundle_url, [{"blobs": blobs, "has_more": False, "cursor": 3}])
    assert result["error"] is None
    assert (result["cursor"], result["clock"], result["ids"]) == (3, 3, ["mem_1", "mem_2"])


@pytest.mark.parametrize(
    ("forge", "says"),
    [
        (lambda b: {"blobs": b, "has_more": False}, "without a cursor"),
        (lambda b: {"blobs": b, "has_more": False, "cursor": 2}, "after a last blob"),
        (lambda b: {"blobs": [b[1], b[0]], "has_more": False, "cursor": 2}, "sequence 1 after"),
        (lambda b: {"blobs": b, "has_more": False, "cursor": 3, "head": 2}, "past the vault"),
        (lambda b: {"blobs": [], "has_more": True, "cursor": 0}, "announced more blobs"),
        (lambda b: {"blobs": [], "has_more": False, "cursor": 5}, "without sending any"),
        (lambda b: {"blobs": "x", "has_more": False, "cursor": 3}, "`blobs` is not a list"),
        (lambda b: {"blobs": [{**b[0], "deleted": 0}], "has_more": False, "cursor": 1},
         "deleted is not a bool"),
    ],
)  # fmt: skip
def test_a_forged_page_is_refused_whole_and_reported(
    browser: BrowserThread, bundle_url: str, blobs: list[dict[str, Any]], forge: Any, says: str
) -> None:
    result = pull(browser, bundle_url, [forge(blobs)])
    assert result["error"][0] == "PageRefused"
    assert says in result["error"][1]
    assert result["refused"] == [result["error"][1]]
    assert (result["cursor"], result["clock"], result["ids"]) == (0, 0, [])


def test_a_blob_failing_its_hmac_is_skipped_and_reported(
    browser: BrowserThread, bundle_url: str, blobs: list[dict[str, Any]]
) -> None:
    forged = [dict(blobs[0], vector_clock=1000), blobs[1]]  # the clock is under the HMAC
    result = pull(browser, bundle_url, [{"blobs": forged, "has_more": False, "cursor": 2}])
    assert result["error"] is None
    assert result["ids"] == ["mem_2"]
    assert result["clock"] == 2  # the forged clock never raised it
    assert len(result["skipped"]) == 1
    assert "HMAC mismatch" in result["skipped"][0]


def test_resync_required_re_pulls_from_zero_once(
    browser: BrowserThread, bundle_url: str, blobs: list[dict[str, Any]]
) -> None:
    honest = {"blobs": blobs, "has_more": False, "cursor": 3}
    result = pull(browser, bundle_url, ["resync", honest])
    assert result["error"] is None
    assert result["ids"] == ["mem_1", "mem_2"]
    endless = pull(browser, bundle_url, ["resync", "resync", honest])
    assert endless["error"] == ["RelayError", "compacted"]
    assert endless["ids"] == []
