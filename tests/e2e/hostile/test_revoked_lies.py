"""A relay that says "revoked" once (issue 31 finding 8; client._sync.revocation).

The relay's word that this device is revoked (a push answer's `revoked_devices`, PROTOCOL
§8; a 403 `device_revoked`, §10; the live feed's `event: revoked`, §15) is reported at
once, and the device pushes nothing while the relay says it; but it is a state the next
sync asks about again, not a verdict kept for good: once the relay is honest, the next
sync works without anything done by the person, and every edit that waited reaches the
other devices. Beside each lie, the honest revocation: it still holds, sync after sync,
and nothing of the revoked device is pushed.
"""

from __future__ import annotations

from typing import Any

import pytest

from engram_sync.client._errors import DeviceRevokedError
from tests.e2e.helpers import add, contents
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import Answer, event_stream, rewrite_json
from tests.e2e.hostile.test_live_feed import EVENTS, RETRY, offer
from tests.e2e.live_support import Watcher, wait_for

PUSH = r"/push$"
PULL = r"/pull$"


def _device_id(scene: Scene, name: str) -> str:
    handle = next(h for h in scene.handles if h.name == name)
    with handle.open() as session:
        return session.device.device_id


def _lie_in_push_answer(scene: Scene, device_id: str) -> None:
    def change(answer: dict[str, Any]) -> None:
        answer["revoked_devices"] = [device_id]

    scene.proxy.on("POST", PUSH, rewrite_json(change), times=1)


def _lie_on_pull(scene: Scene, device_id: str) -> None:
    body = {"error": f"device {device_id} was revoked for this vault", "code": "device_revoked"}
    scene.proxy.on("GET", PULL, lambda e: Answer(403, body), forward=False, times=1)


@pytest.mark.parametrize("where", ["push answer", "pull"])
def test_one_revoked_lie_is_reported_then_the_next_sync_works(scene: Scene, where: str) -> None:
    alpha, bravo = scene.device("alpha"), scene.device("bravo", through_proxy=False)
    me = _device_id(scene, "alpha")
    first = add(alpha, "written before the lie")
    (_lie_in_push_answer if where == "push answer" else _lie_on_pull)(scene, me)

    with pytest.raises(DeviceRevokedError, match=f"this device \\({me}\\) was revoked"):
        alpha.sync()  # reported at once (PROTOCOL §8)
    with alpha.open() as session:
        assert session.state.revoked
    second = add(alpha, "written while the relay said revoked")

    report = alpha.sync()  # the relay is honest again: no `link`, nothing done by the person
    assert report.pushed >= 1
    with alpha.open() as session:
        assert not session.state.revoked
        assert session.device.device_id == me  # a lie never costs the device its id
    bravo.sync()
    assert {first, second} <= set(contents(bravo))
    assert set(contents(alpha)) >= {first, second}


def test_an_honest_revocation_still_holds_sync_after_sync(scene: Scene) -> None:
    alpha, bravo = scene.device("alpha"), scene.device("bravo", through_proxy=False)
    me = _device_id(scene, "alpha")
    before = add(alpha, "written before the revocation")
    alpha.sync()
    with bravo.relay_client() as admin:
        admin.revoke_device(scene.vault_id, me)
    after = add(alpha, "written after the revocation")

    for _ in range(2):  # the second sync asks again, and the relay says it again
        pushes = len(scene.proxy.requests("POST", PUSH))
        with pytest.raises(DeviceRevokedError, match=f"this device \\({me}\\) was revoked"):
            alpha.sync()
        with alpha.open() as session:
            assert session.state.revoked
    assert len(scene.proxy.requests("POST", PUSH)) == pushes  # asked again: nothing pushed
    bravo.sync()
    assert before in contents(bravo)
    assert after not in contents(bravo)
    assert after in contents(alpha)  # kept, still pending


def test_event_revoked_from_a_lying_feed_ends_the_watch_once(scene: Scene) -> None:
    alpha, bravo = scene.device("alpha"), scene.device("bravo", through_proxy=False)
    offer(scene, "events")
    revoked = b'event: revoked\ndata: {"code": "device_revoked"}\n\n'
    scene.proxy.on("GET", EVENTS, lambda e: event_stream(RETRY, (0.5, revoked), hold=60),
                   forward=False, times=1)  # fmt: skip
    alpha.restart()
    watch = Watcher(alpha.path).start()
    wait_for(lambda: not watch.running, "the end of the watch")
    assert isinstance(watch.error, DeviceRevokedError)  # reported at once (PROTOCOL §15)
    with alpha.open() as session:
        assert session.state.revoked

    waited = add(alpha, "written after the feed said revoked")
    alpha.sync()  # the relay never revoked it: the next sync works, nothing done by the person
    with alpha.open() as session:
        assert not session.state.revoked
    bravo.sync()
    assert waited in contents(bravo)
