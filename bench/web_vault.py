"""The web vault's figures (issue 34 "Figures"; docs/web-vault.md), in Debian's Chromium, five
rows of one run, each with its PASS/FAIL (bench.targets.web_vault_targets judges the same):

1. `web_unlock`: seconds from the Unlock click to the vault's memories listed, on a vault of
   one page (100 memories): the two Argon2id derivations (Workers), the device registration,
   the pull, verify, decrypt and the list. Target <= 2 s.
2. `web_pull_10k`: on a vault of N memories (10,000), seconds from the keys derived to the N
   memories listed: every cursor page pulled through `engram-sync web`'s proxy, checked,
   each blob's HMAC verified and decrypted, the list rendered. Target <= 3 s.
3. `web_search_10k`: a search over those N memories typed into the page (the `engram:search`
   measure: the search and its results rendered); the median of S queries. The first query
   after a pull also builds the index, reported apart. Target <= 50 ms.
4-5. `web_live_to_cli`, `web_live_from_cli`: a memory added in the page seen on a CLI device
   running `Vault.watch`, and the reverse, p50 <= 200 ms each (bench.web_live).

The page's own performance marks (web/js/app.js) time the phases, so no figure includes
Playwright's round trips. The vaults are sealed by shared_format (bench.corpus's memories) and
pushed to a real relay; the page is served by `engram-sync web`'s app, proxying to it.

4. `web_passkey_unlock` (bench.web_passkey): seconds from the passkey's PRF output to the
   vault's memories (one page) listed. Target <= 300 ms. `web_passkey_vault_unlock`: the same
   for a passphrase vault (the API key sealed under the passkey, no account).

`python -m bench.web_vault [--quick] [--memories N]` runs them alone on an embedded PostgreSQL
and a relay process of their own; `python -m bench` runs them on its relay.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from bench import web_passkey
from bench.browser import CHROMIUM, BrowserThread, ServedApp, open_bundle
from bench.corpus import memory_plaintext, new_memory_id
from bench.web_live import measure_live
from engram_sync.client._http.relay_client import RelayClient
from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.padding import pad_plaintext
from engram_sync.shared_format.plaintext import encode_memory
from engram_sync.shared_format.sync_keys import derive_sync_keys
from engram_sync.shared_format.timestamps import utc_now_rfc3339

PASSPHRASE: Final = "web vault bench correct horse battery staple"  # noqa: S105 - bench data
QUERIES: Final = ("deploy", "relay vault", "postgres backup restore", "Alice friday",
                  "incident alert owner", "cache", "review meeting notes", "docker",
                  "timeout retry", "zzz-no-match")  # fmt: skip
Log = Callable[[str], None]


@dataclass(frozen=True)
class Size:
    """Memories of the unlock vault and of the large vault, and the searches timed."""

    unlock_memories: int = 100
    memories: int = 10_000
    searches: int = len(QUERIES)
    live: int = 20  # adds each way of the live rows (bench.web_live)

    @classmethod
    def of(cls, *, quick: bool) -> Size:
        return cls(100, 1_000, 5, 5) if quick else cls()


def seed(
    cipher: BlobCipher, relay_url: str, key: str, vault_id: str, count: int, seed: int = 34
) -> None:
    """`count` memories sealed with `cipher` (the bench passphrase's keys) and pushed (1,000 a
    push)."""
    rng = random.Random(seed)  # noqa: S311 - test data, not crypto
    blobs = []
    for clock in range(1, count + 1):
        memory_id = new_memory_id(rng)
        stamp = utc_now_rfc3339()
        text = pad_plaintext(encode_memory(memory_plaintext(rng, memory_id, stamp)))
        blobs.append(cipher.seal(text, vault_id=vault_id, memory_id=memory_id,
                                 device_id="bench-seed", vector_clock=clock, deleted=False,
                                 created_at=stamp))  # fmt: skip
    with RelayClient(relay_url, key) as client:
        for start in range(0, count, 1000):
            answer = client.push(vault_id, blobs[start : start + 1000])
            if answer.rejected:
                raise RuntimeError(f"the relay rejected {len(answer.rejected)} seeded blobs")


MARKS: Final = """() => Object.fromEntries(performance.getEntriesByType('mark')
  .map((m) => [m.name, m.startTime]))"""
SEARCHES: Final = """() => performance.getEntriesByType('measure')
  .filter((m) => m.name === 'engram:search').map((m) => m.duration)"""


def _unlock(page: Any, url: str, key: str, vault_id: str, count: int) -> dict[str, float]:
    open_bundle(page, url)
    page.fill("#api-key", key)
    page.fill("#vault-id", vault_id)
    page.fill("#passphrase", PASSPHRASE)
    page.click("#unlock-button")
    page.wait_for_function(
        f"() => document.querySelectorAll('#memories li').length === {count}"
        " || document.getElementById('status').classList.contains('error')"
    )
    listed = page.locator("#memories li").count()
    if listed != count:
        raise RuntimeError(f"the page listed {listed} of {count}: {page.inner_text('#status')}")
    marks: dict[str, float] = page.evaluate(MARKS)
    return marks


def _unlock_and_search(page: Any, url: str, key: str, vault_id: str, size: Size) -> dict[str, Any]:
    marks = _unlock(page, url, key, vault_id, size.memories)
    for query in QUERIES[: size.searches]:
        page.fill("#search", query)  # one input event: one search
    page.wait_for_function(f"() => ({SEARCHES})().length >= {size.searches}")
    return {"marks": marks, "searches_ms": page.evaluate(SEARCHES)}


def measure(
    relay_url: str, key: str, size: Size, log: Log, browser: BrowserThread | None = None
) -> dict[str, Any]:
    """The three rows (module docstring) in `browser` (else one of its own);
    `{"skipped": reason}` without Chromium."""
    if not CHROMIUM.exists():
        return {"skipped": f"no Chromium at {CHROMIUM} (apt-get install chromium)"}
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return {"skipped": "playwright is not installed (pip install -e '.[test]')"}
    from engram_sync.client._web.app import build_app
    from engram_sync.client._web.bundle import bundle_dir

    small, large = f"web-bench-{secrets.token_hex(4)}", f"web-bench-{secrets.token_hex(4)}"
    log(f"web vault: sealing and pushing {size.unlock_memories} + {size.memories:,} memories")
    cipher = BlobCipher(derive_sync_keys(PASSPHRASE))
    seed(cipher, relay_url, key, small, size.unlock_memories)
    seed(cipher, relay_url, key, large, size.memories, seed=35)
    own = browser is None
    browser = browser or BrowserThread()
    try:
        with ServedApp(build_app(bundle_dir(), relay_url, None)) as web:
            log("web vault: unlock")
            first = browser.run(lambda p: _unlock(p, web.url, key, small, size.unlock_memories))
            log(f"web vault: pull of {size.memories:,} memories and {size.searches} searches")
            second = browser.run(
                lambda p: _unlock_and_search(p, web.url, key, large, size),
                timeout=300, step_ms=120_000,
            )  # fmt: skip
            log("web vault: passkey unlock")
            email, vault_id = web_passkey.make_account(relay_url, PASSPHRASE, seed,
                                                       size.unlock_memories)  # fmt: skip
            passkey = browser.run(lambda p: web_passkey.passkey_marks(
                p, web.url, email, vault_id, size.unlock_memories), timeout=120)  # fmt: skip
            log("web vault: passkey unlock of a passphrase vault")
            by_vault = browser.run(lambda p: web_passkey.vault_passkey_marks(
                p, web.url, key, small, PASSPHRASE, size.unlock_memories), timeout=120)  # fmt: skip
        log(f"web vault: live, {size.live} adds each way between the page and a CLI watch")
        live = measure_live(relay_url, key, size.live, browser) if size.live else None
    finally:
        if own:
            browser.close()
    marks = second["marks"]
    searches = second["searches_ms"]
    return {
        "unlock": {
            "memories": size.unlock_memories,
            "unlock_s": (first["engram:listed"] - first["engram:unlock"]) / 1000,
            "keys_s": (first["engram:keys"] - first["engram:unlock"]) / 1000,
        },
        "pull": {
            "memories": size.memories,
            "pull_s": (marks["engram:listed"] - marks["engram:keys"]) / 1000,
            "pulled_s": (marks["engram:pulled"] - marks["engram:keys"]) / 1000,
            "keys_s": (marks["engram:keys"] - marks["engram:unlock"]) / 1000,
        },
        "search": {
            "memories": size.memories,
            "searches": len(searches),
            "median_ms": statistics.median(searches[1:] or searches),
            "first_ms": searches[0],  # builds the index too
            "max_ms": max(searches),
        },
        "passkey": web_passkey.section(passkey, size.unlock_memories),
        "passkey_vault": web_passkey.section(by_vault, size.unlock_memories),
        **({"live": live} if live else {}),
        "chromium": str(CHROMIUM),
        "load_average": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    """The three rows alone, on their own embedded PostgreSQL and relay process."""
    from bench.alone import run_alone
    from bench.targets import web_vault_targets

    parser = argparse.ArgumentParser(prog="python -m bench.web_vault")
    parser.add_argument("--quick", action="store_true", help="small sizes: seconds")
    parser.add_argument("--memories", type=int, help="N of the large vault (default 10000)")
    args = parser.parse_args(argv)
    size = Size.of(quick=args.quick)
    if args.memories:
        size = Size(size.unlock_memories, args.memories, size.searches, size.live)
    return run_alone(lambda scratch, url, key, log: measure(url, key, size, log), web_vault_targets)


if __name__ == "__main__":
    raise SystemExit(main())
