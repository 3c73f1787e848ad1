"""A restored relay and the page (PROTOCOL §17; web/js/restore.js, docs/web-vault.md "Relay
restore"): the relay loses rows and answers another generation (as
tests/e2e/hostile/test_restored_relay.py simulates it, through the hostile proxy); the page,
after a reload and unlock or on a Sync, pulls again from cursor 0, pushes back every version the
relay lacks (a tombstone too), says so once and deletes nothing; a fresh Python device then
sees every memory. A proxy answering a new generation every time keeps the page bounded (one
full re-pull per pull), reported, nothing deleted."""

from __future__ import annotations

import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from engram_sync.client import Vault
from engram_sync.client._session import VaultSession
from tests.e2e.conftest import PASSPHRASE
from tests.e2e.hostile.conftest import proxy as proxy  # a lying proxy per test
from tests.e2e.hostile.conftest import relay_process as relay_process  # the real relay
from tests.e2e.hostile.proxy import Answer, HostileProxy, rewrite_json
from tests.relay.conftest import ADMIN_KEY, Relay
from tests.web.conftest import BrowserThread
from tests.web.test_hostile_relay import _unlock
from tests.web.test_hostile_relay import vault_id as vault_id  # 2 memories from alpha
from tests.web.test_hostile_relay import web_url as web_url  # `engram-sync web` via the proxy

RESTORED = "the relay was restored"
LIVE_COLUMNS = "device_id, vector_clock, ciphertext, hmac, created_at, created_at_ts, size_bytes"
IDS = "() => [...document.querySelectorAll('#memories li')].map((li) => li.dataset.id)"


def _sql(relay: Relay, query: str, *args: Any) -> list[Any]:
    """relay.sql from the browser's thread (its own event loop runs there)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(relay.sql, query, *args).result()


def _new_generation(proxy: HostileProxy, generation: str) -> None:
    def rewrite(value: dict[str, Any]) -> None:
        value["generation"] = generation

    proxy.on("GET", r"/pull$", rewrite_json(rewrite))
    proxy.on("POST", r"/push$", rewrite_json(rewrite))


def _problems(page: Any) -> list[str]:
    return [str(p) for p in page.locator("#problem-list li").all_inner_texts()]


def _wait_restored(page: Any, count: int = 1) -> None:
    page.wait_for_function(
        f"() => [...document.querySelectorAll('#problem-list li')]"
        f".filter((li) => li.textContent.startsWith({json.dumps(RESTORED)})).length >= {count}"
    )


def _add(page: Any, content: str) -> None:
    page.fill("#add-content", content)
    page.click("#add-button")
    page.wait_for_function(
        "() => document.getElementById('status').textContent.startsWith('Added')"
    )


def _delete(page: Any, memory_id: str) -> None:
    page.click(f"#memories li[data-id='{memory_id}']")
    page.click("#delete-button")
    page.wait_for_function(
        "() => document.getElementById('status').textContent.startsWith('Deleted')"
    )


def _restore_after_reload(
    page: Any, url: str, relay: Relay, proxy: HostileProxy, vault_id: str
) -> dict[str, Any]:
    _unlock(page, url)
    first, second = page.evaluate(IDS)
    _add(page, "written in the page before the restore")
    added = next(i for i in page.evaluate(IDS) if i not in (first, second))
    (live,) = _sql(
        relay,
        f"SELECT {LIVE_COLUMNS} FROM blobs WHERE vault_id = $1 AND memory_id = $2",
        vault_id,
        second,
    )
    _delete(page, second)
    # the restore: the relay lost the page's memory and alpha's first one, holds the second
    # one live again (its tombstone lost), and answers a new generation
    _sql(relay, "DELETE FROM blobs WHERE vault_id = $1 AND memory_id = ANY($2)", vault_id,
         [first, added])  # fmt: skip
    _sql(
        relay,
        "UPDATE blobs SET device_id = $3, vector_clock = $4, ciphertext = $5, hmac = $6,"
        " created_at = $7, created_at_ts = $8, size_bytes = $9, deleted = false"
        " WHERE vault_id = $1 AND memory_id = $2",
        vault_id, second, *live.values(),
    )  # fmt: skip
    _new_generation(proxy, "f" * 32)
    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    _unlock(page, url)
    _wait_restored(page)
    page.click("#sync-button")  # the honest next pull: the new generation is the known one
    page.wait_for_timeout(300)
    return {
        "ids": (first, second, added),
        "problems": _problems(page),
        "listed": sorted(page.evaluate(IDS)),
    }


def test_after_a_restore_and_a_reload_the_page_pushes_back_what_the_relay_lacks(
    browser: BrowserThread,
    proxy: HostileProxy,
    relay_process: Relay,
    web_url: str,
    vault_id: str,
    tmp_path: Path,
) -> None:
    seen = browser.run(lambda page: _restore_after_reload(page, web_url, relay_process, proxy,
                                                          vault_id))  # fmt: skip
    first, second, added = seen["ids"]
    restored = [p for p in seen["problems"] if p.startswith(RESTORED)]
    assert restored == [
        "the relay was restored: 3 versions pushed back; nothing deleted (its generation "
        "changed or its sequence went back: everything pulled again)"
    ]  # once: the Sync after it is an ordinary pull
    assert seen["listed"] == sorted([first, added])  # nothing deleted in the page
    rows = relay_process.sql("SELECT memory_id, deleted FROM blobs WHERE vault_id = $1", vault_id)
    assert {r["memory_id"]: r["deleted"] for r in rows} == {
        first: False, second: True, added: False,
    }  # fmt: skip
    with VaultSession.open(tmp_path / "bravo", PASSPHRASE, create=True) as session:
        session.link(proxy.url, ADMIN_KEY, vault_id, "bravo")
        vault = Vault(session)
        vault.sync()
        contents = sorted(m.content for m in vault.list())
    assert contents == ["first memory", "written in the page before the restore"]


def _restore_then_sync(page: Any, url: str, relay: Relay, proxy: HostileProxy,
                       vault_id: str) -> dict[str, Any]:  # fmt: skip
    _unlock(page, url)
    _sql(relay, "DELETE FROM blobs WHERE vault_id = $1", vault_id)
    _new_generation(proxy, "e" * 32)
    page.click("#sync-button")
    _wait_restored(page)
    page.click("#sync-button")
    page.wait_for_timeout(300)
    return {"problems": _problems(page), "listed": page.evaluate(IDS)}


def test_a_sync_after_a_restore_repairs_the_relay_and_says_so_once(
    browser: BrowserThread,
    proxy: HostileProxy,
    relay_process: Relay,
    web_url: str,
    vault_id: str,
) -> None:
    seen = browser.run(
        lambda page: _restore_then_sync(page, web_url, relay_process, proxy, vault_id)
    )
    assert [p for p in seen["problems"] if p.startswith(RESTORED)] == [
        "the relay was restored: 2 versions pushed back; nothing deleted (its generation "
        "changed or its sequence went back: everything pulled again)"
    ]
    assert len(seen["listed"]) == 2
    rows = relay_process.sql("SELECT deleted FROM blobs WHERE vault_id = $1", vault_id)
    assert [r["deleted"] for r in rows] == [False, False]


def _flipping(page: Any, url: str, proxy: HostileProxy) -> dict[str, Any]:
    _unlock(page, url)
    generations = (f"{n:032x}" for n in itertools.count(1))
    proxy.on("GET", r"/pull$", rewrite_json(lambda v: {**v, "generation": next(generations)}))
    proxy.on("POST", r"/push$", rewrite_json(lambda v: {**v, "generation": next(generations)}))
    before = len(proxy.requests("GET", r"/pull$"))
    page.click("#sync-button")
    _wait_restored(page)
    page.wait_for_timeout(1500)  # a page pulling for ever would pull again and again meanwhile
    return {
        "pulls": len(proxy.requests("GET", r"/pull$")) - before,
        "pushes": len(proxy.requests("POST", r"/push$")),
        "problems": _problems(page),
        "listed": page.evaluate(IDS),
    }


def test_a_generation_flipping_on_every_answer_is_bounded_and_deletes_nothing(
    browser: BrowserThread, proxy: HostileProxy, relay_process: Relay, web_url: str,
    vault_id: str,
) -> None:  # fmt: skip
    seen = browser.run(lambda page: _flipping(page, web_url, proxy))
    # one Sync: the page that shows the restore and the full re-pull, once (no loop)
    assert seen["pulls"] == 2
    assert [p for p in seen["problems"] if p.startswith(RESTORED)] == [
        "the relay was restored: 0 versions pushed back; nothing deleted (its generation "
        "changed or its sequence went back: everything pulled again)"
    ]
    assert seen["pushes"] == 1  # alpha's push of the fixture; the relay lacked nothing
    assert len(seen["listed"]) == 2
    rows = relay_process.sql("SELECT deleted FROM blobs WHERE vault_id = $1", vault_id)
    assert [r["deleted"] for r in rows] == [False, False]


def _push_shows(page: Any, url: str, relay: Relay, proxy: HostileProxy,
                vault_id: str) -> dict[str, Any]:  # fmt: skip
    _unlock(page, url)
    _sql(relay, "DELETE FROM blobs WHERE vault_id = $1", vault_id)

    def new_generation(value: dict[str, Any]) -> None:
        value["generation"] = "d" * 32

    proxy.on("POST", r"/push$", rewrite_json(new_generation), times=1)  # a push answer only
    _add(page, "written after the restore")
    _wait_restored(page)
    return {"problems": _problems(page), "listed": page.evaluate(IDS)}


def test_a_push_answer_of_another_generation_makes_the_page_repair_at_once(
    browser: BrowserThread, proxy: HostileProxy, relay_process: Relay, web_url: str,
    vault_id: str,
) -> None:  # fmt: skip
    seen = browser.run(lambda page: _push_shows(page, web_url, relay_process, proxy, vault_id))
    restored = [p for p in seen["problems"] if p.startswith(RESTORED)]
    assert len(restored) == 1
    assert restored[0].startswith("the relay was restored: 2 versions pushed back")
    assert len(seen["listed"]) == 3
    rows = relay_process.sql("SELECT deleted FROM blobs WHERE vault_id = $1", vault_id)
    assert [r["deleted"] for r in rows] == [False] * 3


def _head_back(page: Any, url: str, proxy: HostileProxy) -> dict[str, Any]:
    _unlock(page, url)

    def head_went_back(value: dict[str, Any]) -> None:
        value["head"] = 1
        value["cursor"] = min(int(value["cursor"]), 1)
        value.pop("generation", None)

    proxy.on("GET", r"/pull$", rewrite_json(head_went_back), times=1)
    page.click("#sync-button")
    _wait_restored(page)
    cursors = [e.query.get("cursor") for e in proxy.requests("GET", r"/pull$")]
    return {"problems": _problems(page), "listed": page.evaluate(IDS), "cursors": cursors}


def test_a_vault_sequence_below_the_cursor_is_a_restore(
    browser: BrowserThread, proxy: HostileProxy, web_url: str
) -> None:
    seen = browser.run(lambda page: _head_back(page, web_url, proxy))
    restored = [p for p in seen["problems"] if p.startswith(RESTORED)]
    assert len(restored) == 1
    assert restored[0].startswith("the relay was restored: 0 versions pushed back")
    assert seen["cursors"][-2:] == ["2", "0"]  # the lying page, then the full re-pull
    assert len(seen["listed"]) == 2


def _live_after_restore(page: Any, url: str, relay: Relay, proxy: HostileProxy,
                        vault_id: str, alpha: Path) -> dict[str, Any]:  # fmt: skip
    _unlock(page, url)
    page.wait_for_function(  # the proxy does not stream: the page long-polls (PROTOCOL §15)
        "() => document.getElementById('live-mode').textContent === 'live updates: long-poll'"
    )
    _sql(relay, "DELETE FROM blobs WHERE vault_id = $1", vault_id)
    _new_generation(proxy, "c" * 32)
    with VaultSession.open(alpha, PASSPHRASE) as session:  # another device writes meanwhile
        vault = Vault(session)
        vault.add("written by alpha after the restore")
        vault.sync()
    _wait_restored(page)  # no Sync click: the live feed's hint made the page pull
    page.wait_for_function("() => document.querySelectorAll('#memories li').length === 3")
    return {"problems": _problems(page), "listed": page.evaluate(IDS)}


def test_the_live_feed_pull_after_a_restore_repairs_without_a_click(
    browser: BrowserThread, proxy: HostileProxy, relay_process: Relay, web_url: str,
    vault_id: str, tmp_path: Path,
) -> None:  # fmt: skip
    gone = Answer(status=404, body={"error": "no streams here", "code": "not_found"})
    proxy.on("GET", r"/events$", lambda _: gone, forward=False)
    seen = browser.run(lambda page: _live_after_restore(page, web_url, relay_process, proxy,
                                                        vault_id, tmp_path / "alpha"))  # fmt: skip
    assert len([p for p in seen["problems"] if p.startswith(RESTORED)]) == 1
    assert len(seen["listed"]) == 3
    rows = relay_process.sql("SELECT deleted FROM blobs WHERE vault_id = $1", vault_id)
    assert [r["deleted"] for r in rows] == [False] * 3  # alpha or the page pushed the 2 back
