"""The digest a push answer or a last pull page carries (`vault_digest`, ours, issue 36;
docs/digest.md "Carried in push and pull answers"): honest, it ends a sync's check without
a `GET /digest`; any lie in it (another digest, count or sequence) only makes the device
ask `GET /digest` and go on as without it, so nothing is deleted, skipped or narrowed on
its word. A relay lying in both is tests/e2e/hostile/test_lying_digest.py; a relay without
the feature (an older one) gets the check as before.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from typing import Any

import pytest

from engram_sync.client._sync.reports import DigestReport, SyncReport
from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add, contents, delete
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import Answer, Exchange, rewrite_json

SYNC_REQUESTS = r"/(pull|push|digest|digest/narrow|fetch)$"


def _requests(scene: Scene) -> list[str]:
    """The sync requests the proxy saw, as "METHOD last-part" (the /v1/info asks left out)."""
    seen = scene.proxy.requests("GET", SYNC_REQUESTS) + scene.proxy.requests("POST", SYNC_REQUESTS)
    return sorted(f"{e.method} {e.path.rsplit('/', 1)[-1]}" for e in seen)


def _digest(report: SyncReport) -> DigestReport:
    assert report.digest is not None  # the relay offers the digest: every sync checks
    return report.digest


def _ready(scene: Scene) -> tuple[DeviceHandle, DeviceHandle]:
    alpha, bravo = scene.device("alpha"), scene.device("bravo")
    ids = [add(alpha, f"memory {i}") for i in range(5)]
    delete(alpha, ids[0])
    for device in (alpha, bravo, alpha):
        device.sync()
    scene.proxy.log.clear()
    return alpha, bravo


def test_one_memory_goes_a_to_b_in_three_requests_and_both_checks_agree(scene: Scene) -> None:
    alpha, bravo = _ready(scene)
    memory_id = add(alpha, "one memory more")
    sent = _digest(alpha.sync())
    assert _requests(scene) == ["GET pull", "POST push"]
    got = bravo.sync()
    assert _requests(scene) == ["GET pull", "GET pull", "POST push"]  # no GET /digest
    for check in (sent, _digest(got)):
        assert (check.matched, check.carried, check.round_trips, check.buckets) == (
            True,
            True,
            1,
            [],
        )
    assert got.applied == 1
    assert memory_id in contents(bravo)
    assert all(e.query.get("digest") == "1" for e in scene.proxy.requests("GET", r"/pull$"))


def _lie_in_carried(change: Callable[[dict[str, Any]], None]) -> Callable[[Any], None]:
    def rewrite(body: Any) -> None:
        if isinstance(body, dict) and isinstance(body.get("vault_digest"), dict):
            change(body["vault_digest"])

    return rewrite


CARRIED_LIES: dict[str, Callable[[dict[str, Any]], None]] = {
    "another digest": lambda d: d.update(digest=base64.b64encode(os.urandom(32)).decode()),
    "the empty vault's": lambda d: d.update(count=0, digest=base64.b64encode(bytes(32)).decode()),
    "one version more": lambda d: d.update(count=d["count"] + 1),
    "another sequence": lambda d: d.update(cursor=d["cursor"] + 1),
    "not base64": lambda d: d.update(digest="not base64 at all"),
}


@pytest.mark.parametrize("lie", list(CARRIED_LIES))
def test_a_lying_carried_digest_only_costs_a_request(scene: Scene, lie: str) -> None:
    alpha, bravo = _ready(scene)
    before = contents(alpha)
    rewrite = rewrite_json(_lie_in_carried(CARRIED_LIES[lie]))
    scene.proxy.on("GET", r"/pull$", rewrite)
    scene.proxy.on("POST", r"/push$", rewrite)
    add(alpha, "one memory more")
    for device in (alpha, bravo):
        scene.proxy.log.clear()
        check = _digest(device.sync())
        assert scene.proxy.requests("GET", r"/digest$")  # the lie was not believed: asked
        assert (check.matched, check.buckets, check.round_trips) == (True, [], 1)
        assert not scene.proxy.requests("POST", r"/(digest/narrow|fetch)$")
        assert (check.fetched, check.requeued, check.restored, check.compacted) == (0, 0, 0, 0)
    after = contents(alpha)
    assert set(before) < set(after)  # nothing deleted, the new one kept
    assert contents(bravo) == after  # nothing skipped on the way
    scene.proxy.honest()  # the honest counterpart: the check rests on the carried digest
    scene.proxy.log.clear()
    check = _digest(alpha.sync())
    assert (check.matched, check.carried) == (True, True)
    assert not scene.proxy.requests("GET", r"/digest$")


def _without_the_feature(exchange: Exchange) -> Answer:
    body: dict[str, Any] = exchange.json()
    body["features"] = [f for f in body["features"] if f != "digest-carried"]
    return Answer(200, body)


def test_a_relay_without_the_feature_is_asked_as_before(scene: Scene) -> None:
    scene.proxy.on("GET", r"/v1/info$", _without_the_feature)
    alpha, bravo = _ready(scene)
    add(alpha, "one memory more")
    for device in (alpha, bravo):
        check = _digest(device.sync())
        assert (check.matched, check.carried, check.round_trips) == (True, False, 1)
    assert len(scene.proxy.requests("GET", r"/digest$")) == 2
    assert not any("digest" in e.query for e in scene.proxy.requests("GET", r"/pull$"))
    assert not any("digest" in e.query for e in scene.proxy.requests("POST", r"/push$"))
    assert contents(bravo) == contents(alpha)
