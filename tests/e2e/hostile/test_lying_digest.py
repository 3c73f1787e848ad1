"""A relay that lies in its digest answers (PROTOCOL §18, docs/digest.md) must never make a
device delete a memory or skip one: its digests and lists can only make the device fetch
blobs (which must verify), push again, or leave a tombstone out of its own digest. Each
attack has its honest run through the same proxy next to it."""

from __future__ import annotations

import base64
import os
from typing import Any

from engram_sync.client._sync.anti_entropy import DigestReport
from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add, contents, delete
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import Answer, Exchange


def _digest(device: DeviceHandle) -> DigestReport:
    report = device.sync().digest
    assert report is not None
    return report


def _known_clocks(device: DeviceHandle) -> dict[str, int]:
    with device.open() as session:
        rows = session.vault.conn.execute("SELECT memory_id, vector_clock FROM sync_known_clocks")
        return {r[0]: r[1] for r in rows}


def _lies(exchange: Exchange) -> Answer | None:
    """Every digest answer a lie: another vault digest, every bucket different, each list
    claiming newer versions of half the memories and a tombstone at the very version the
    device holds of the other half; fetched blobs made into those newer tombstones (their
    HMAC then fails)."""
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
    for entry in body.get("entries", []):
        if entry[0][-1] in "02468ace":  # half of the memories, by their id
            entry[2] += 1000
        else:
            entry[3] = True
    return Answer(200, body)


def test_lying_digests_and_lists_delete_and_skip_nothing(scene: Scene) -> None:
    alpha = scene.device("alpha")
    ids = [add(alpha, f"memory {i}") for i in range(12)]
    delete(alpha, ids[0])
    alpha.sync()
    honest = _digest(alpha)
    assert honest.matched  # the honest run through the same proxy agrees
    before, clocks = contents(alpha), _known_clocks(alpha)

    scene.proxy.on("GET", r"/digest$", _lies)
    scene.proxy.on("POST", r"/fetch$", _lies)
    report = alpha.sync()
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
    body["digest"] = base64.b64encode(bytes(32)).decode()
    body["count"] = 0
    return Answer(200, body)


def test_a_relay_claiming_to_hold_nothing_gets_pushes_not_deletions(scene: Scene) -> None:
    alpha = scene.device("alpha")
    ids = [add(alpha, f"memory {i}") for i in range(6)]
    delete(alpha, ids[0])
    alpha.sync()
    assert _digest(alpha).matched
    before, clocks = contents(alpha), _known_clocks(alpha)

    scene.proxy.on("GET", r"/digest$", _empty_lists)
    report = alpha.sync()
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
    if "entries" in body:
        body["entries"] = [["mem_same", "device", 1, False]]
        body["has_more"] = True
    return Answer(200, body)


def test_an_endless_list_is_refused_and_the_sync_still_succeeds(scene: Scene) -> None:
    alpha = scene.device("alpha")
    for i in range(3):
        add(alpha, f"memory {i}")
    alpha.sync()
    before = contents(alpha)
    scene.proxy.on("GET", r"/digest$", _endless)
    add(alpha, "one more")
    report = alpha.sync()  # no exception: the pull and the push were done
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
