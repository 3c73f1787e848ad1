"""A relay that lies in its digest answers (PROTOCOL §18, docs/digest.md) must never make a
device delete a memory or skip one: its digests and lists can only make the device fetch
blobs (which must verify), push again, or leave a tombstone out of its own digest. Each
attack has its honest run through the same proxy next to it, and runs twice: against a
relay offering `digest-narrow` (the lies are in `POST .../digest/narrow` answers) and
against one that does not (the lies are in the bucket lists)."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable
from typing import Any

import pytest

from engram_sync.client._sync.reports import DigestReport
from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add, contents, delete
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import Answer, Exchange

PATHS = ["narrow", "list"]


def _slot(memory_id: str) -> tuple[int, int]:
    head = hashlib.sha256(memory_id.encode()).digest()
    return head[0], head[1]


def _offer(scene: Scene, path: str) -> None:
    """`list`: the relay's /v1/info answers without `digest-narrow` (an older relay), so
    the device narrows with the bucket lists."""
    assert path in PATHS

    def older(exchange: Exchange) -> Answer:
        body: dict[str, Any] = exchange.json()
        body["features"] = [f for f in body["features"] if f != "digest-narrow"]
        return Answer(200, body)

    if path == "list":
        scene.proxy.on("GET", r"/v1/info$", older)


def _lie_on_both(scene: Scene, action: Callable[[Exchange], Answer | None]) -> None:
    scene.proxy.on("GET", r"/digest$", action)
    scene.proxy.on("POST", r"/digest/narrow$", action)
    # the relay lies in the digest it carries too (docs/digest.md "Carried in push and
    # pull answers"): else the honest carried value settles the check and no lie is asked
    scene.proxy.on("GET", r"/pull$", _carried_lie)
    scene.proxy.on("POST", r"/push$", _carried_lie)


def _carried_lie(exchange: Exchange) -> Answer | None:
    """A pull page's or push answer's `vault_digest` made another vault's."""
    body = exchange.json() if exchange.status == 200 else None
    if not isinstance(body, dict) or not isinstance(body.get("vault_digest"), dict):
        return None
    body["vault_digest"]["digest"] = base64.b64encode(os.urandom(32)).decode()
    return Answer(200, body)


def _used(scene: Scene, path: str) -> None:
    """The narrowing went the way the test meant (the positive case of the other path)."""
    narrowed = scene.proxy.requests("POST", r"/digest/narrow$")
    listed = [e for e in scene.proxy.requests("GET", r"/digest$") if "list" in e.query]
    assert (bool(narrowed), bool(listed)) == (path == "narrow", path == "list")


def _digest(device: DeviceHandle) -> DigestReport:
    report = device.sync().digest
    assert report is not None
    return report


def _known_clocks(device: DeviceHandle) -> dict[str, int]:
    with device.open() as session:
        rows = session.vault.conn.execute("SELECT memory_id, vector_clock FROM sync_known_clocks")
        return {r[0]: r[1] for r in rows}


def _lying_entry(entry: list[Any]) -> list[Any]:
    """Half of the memories (by their id) newer on the relay, the other half a tombstone
    at the very version the device holds."""
    if entry[0][-1] in "02468ace":
        return [entry[0], entry[1], entry[2] + 1000, entry[3]]
    return [entry[0], entry[1], entry[2], True]


def _liar(known: dict[str, tuple[str, int]]) -> Callable[[Exchange], Answer | None]:
    """Every digest answer a lie: another vault digest, every bucket different, each list
    (or narrowing: every sub-bucket different, listing the device's own versions of the
    bucket, which the test knows) claiming the lies of `_lying_entry`; fetched blobs made
    into those newer tombstones (their HMAC then fails)."""

    def lie(exchange: Exchange) -> Answer | None:
        body: dict[str, Any] = exchange.json()
        if exchange.path.endswith("/fetch"):
            for blob in body["blobs"]:  # the newer tombstone the list promised
                blob["deleted"] = True
                blob["vector_clock"] += 1000
            return Answer(200, body)
        body["digest"] = base64.b64encode(os.urandom(32)).decode()
        if "buckets" in body:
            body["buckets"] = base64.b64encode(os.urandom(256 * 8)).decode()
            body["counts"] = [1] * 256
        if exchange.path.endswith("/narrow"):
            bucket = exchange.request_json()["bucket"]
            mine = sorted([m, d, c, False] for m, (d, c) in known.items() if _slot(m)[0] == bucket)
            body["subs"] = list(range(256))
            body["entries"] = [_lying_entry(e) for e in mine]
            body["has_more"] = False
            return Answer(200, body)
        body["entries"] = [_lying_entry(e) for e in body.get("entries", [])]
        return Answer(200, body)

    return lie


@pytest.mark.parametrize("path", PATHS)
def test_lying_digests_and_lists_delete_and_skip_nothing(scene: Scene, path: str) -> None:
    _offer(scene, path)
    alpha = scene.device("alpha")
    ids = [add(alpha, f"memory {i}") for i in range(12)]
    delete(alpha, ids[0])
    alpha.sync()
    honest = _digest(alpha)
    assert honest.matched  # the honest run through the same proxy agrees
    before, clocks = contents(alpha), _known_clocks(alpha)
    with alpha.open() as session:
        rows = session.vault.conn.execute(
            "SELECT memory_id, device_id, vector_clock FROM sync_known_clocks"
        )
        known = {r[0]: (r[1], r[2]) for r in rows}
    lies = _liar(known)
    _lie_on_both(scene, lies)
    scene.proxy.on("POST", r"/fetch$", lies)
    report = alpha.sync()
    _used(scene, path)
    digest = report.digest
    assert digest is not None
    assert not digest.matched  # the lie is reported, not believed
    assert digest.buckets  # it was narrowed down and acted on
    assert digest.unresolved  # "a tombstone at our live version": nothing changed for it
    assert digest.device_lacks > 0
    assert report.invalid == digest.device_lacks  # every forged fetched blob refused
    assert (digest.fetched, digest.restored, report.applied) == (0, 0, 0)
    assert contents(alpha) == before  # nothing deleted
    assert _known_clocks(alpha) == clocks  # no version forgotten

    scene.proxy.honest()
    assert _digest(alpha).matched
    bravo = scene.device("bravo")
    bravo.sync()
    assert contents(bravo) == before  # nothing was skipped on the way to the relay


def _empty_lists(exchange: Exchange) -> Answer | None:
    """The relay claims every bucket differs and holds nothing: a 'restored to empty'
    lie, that every tombstone was compacted and every live memory lost."""
    body: dict[str, Any] = exchange.json()
    if "buckets" in body:
        body["buckets"] = base64.b64encode(bytes(256 * 8)).decode()
        body["counts"] = [0] * 256
    if "entries" in body:
        body["entries"] = []
        body["has_more"] = False
    if "subs" in body:  # every sub-bucket differs, and holds nothing
        body["subs"] = list(range(256))
    body["digest"] = base64.b64encode(bytes(32)).decode()
    body["count"] = 0
    return Answer(200, body)


@pytest.mark.parametrize("path", PATHS)
def test_a_relay_claiming_to_hold_nothing_gets_pushes_not_deletions(
    scene: Scene, path: str
) -> None:
    _offer(scene, path)
    alpha = scene.device("alpha")
    ids = [add(alpha, f"memory {i}") for i in range(6)]
    delete(alpha, ids[0])
    alpha.sync()
    assert _digest(alpha).matched
    before, clocks = contents(alpha), _known_clocks(alpha)

    _lie_on_both(scene, _empty_lists)
    report = alpha.sync()
    _used(scene, path)
    digest = report.digest
    assert digest is not None
    assert (digest.relay_lacks, digest.requeued, digest.compacted) == (5, 5, 1)
    assert report.pushed == 5  # what it claimed to lack went back to it
    assert contents(alpha) == before  # nothing deleted, the deleted one stays deleted
    assert _known_clocks(alpha).keys() == clocks.keys()  # the tombstone's clock is kept

    scene.proxy.honest()
    bravo = scene.device("bravo")
    bravo.sync()
    assert contents(bravo) == before


def _endless(exchange: Exchange) -> Answer | None:
    """Every bucket differs and every list page repeats itself with `has_more` forever."""
    body: dict[str, Any] = exchange.json()
    body["digest"] = base64.b64encode(os.urandom(32)).decode()
    if "buckets" in body:
        body["buckets"] = base64.b64encode(os.urandom(256 * 8)).decode()
    if exchange.path.endswith("/narrow"):  # one memory of the bucket, page after page
        bucket = exchange.request_json()["bucket"]
        same = next(f"mem_same_{k}" for k in range(100_000) if _slot(f"mem_same_{k}")[0] == bucket)
        body["subs"] = [_slot(same)[1]]
        body["entries"] = [[same, "device", 1, False]]
        body["has_more"] = True
    elif "entries" in body:
        body["entries"] = [["mem_same", "device", 1, False]]
        body["has_more"] = True
    return Answer(200, body)


@pytest.mark.parametrize("path", PATHS)
def test_an_endless_list_is_refused_and_the_sync_still_succeeds(scene: Scene, path: str) -> None:
    _offer(scene, path)
    alpha = scene.device("alpha")
    for i in range(3):
        add(alpha, f"memory {i}")
    alpha.sync()
    before = contents(alpha)
    _lie_on_both(scene, _endless)
    add(alpha, "one more")
    report = alpha.sync()  # no exception: the pull and the push were done
    _used(scene, path)
    assert report.pushed == 1
    digest = report.digest
    assert digest is not None
    assert digest.error is not None
    assert "out of order" in digest.error  # the repeated page does not progress
    assert not digest.matched
    assert digest.round_trips <= 4  # refused on the second page, not after 1,000
    assert set(before) <= set(contents(alpha))
    scene.proxy.honest()
    assert _digest(alpha).matched


def _outside(exchange: Exchange) -> Answer | None:
    """A narrowing that names one sub-bucket and lists a memory of another (the device's
    own id of the bucket, at a newer clock, tombstoned): refused as a whole."""
    body: dict[str, Any] = exchange.json()
    if not exchange.path.endswith("/narrow"):
        return None
    bucket = exchange.request_json()["bucket"]
    other = next(f"elsewhere_{k}" for k in range(100_000) if _slot(f"elsewhere_{k}")[0] == bucket)
    body["subs"] = [(_slot(other)[1] + 1) % 256]
    body["entries"] = [[other, "device", 99, True]]
    return Answer(200, body)


def test_a_narrowing_listing_outside_its_sub_buckets_is_refused(scene: Scene) -> None:
    alpha = scene.device("alpha")
    for i in range(4):
        add(alpha, f"memory {i}")
    alpha.sync()
    before, clocks = contents(alpha), _known_clocks(alpha)
    with alpha.open() as session:  # a row lost outside engram-sync: the check must narrow
        session.vault.conn.execute("DELETE FROM engrams WHERE id = ?", (next(iter(before)),))
    scene.proxy.on("POST", r"/digest/narrow$", _outside)
    digest = _digest(alpha)
    assert digest.error is not None
    assert "outside the sub-buckets" in digest.error
    assert (digest.fetched, digest.restored, digest.requeued) == (0, 0, 0)
    assert _known_clocks(alpha) == clocks
    scene.proxy.honest()  # the positive case: the honest narrowing restores the row
    repaired = _digest(alpha)
    assert (repaired.restored, repaired.matched) == (1, True)
    assert contents(alpha) == before
