"""Pages a lying relay forges out of real blobs, and answers that are not what the
protocol promises: each is skipped or refused and reported, never applied; each has its
honest counterpart (issue 13: the cases that already held and must keep holding)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from engram_sync.client._errors import ProtocolError, RelayError, RelayUnavailableError
from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add, contents, edit
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import Answer, Exchange


def stored_blob(scene: Scene, memory_id: str) -> dict[str, Any]:
    """The relay's current blob of a memory, as it would be pulled."""
    (row,) = scene.relay.sql(
        "SELECT vault_id, memory_id, device_id, vector_clock, ciphertext, hmac, created_at,"
        " deleted FROM blobs WHERE vault_id = $1 AND memory_id = $2",
        scene.vault_id,
        memory_id,
    )
    return dict(row)


def inject(*blobs: dict[str, Any]) -> Callable[[Exchange], Answer]:
    """A consistent page of `blobs` right after the asked cursor."""

    def action(exchange: Exchange) -> Answer:
        cursor = int(exchange.query["cursor"])
        page = [dict(b, seq=cursor + i + 1) for i, b in enumerate(blobs)]
        end = cursor + len(page)
        return Answer(200, {"blobs": page, "has_more": False, "cursor": end, "head": end})

    return action


def _two(scene: Scene) -> tuple[DeviceHandle, DeviceHandle, str, str]:
    alpha, bravo = scene.device("alpha"), scene.device("bravo")
    first, second = add(alpha, "first memory"), add(alpha, "second memory")
    alpha.sync()
    bravo.sync()
    return alpha, bravo, first, second


def test_a_rolled_back_version_is_not_applied(scene: Scene) -> None:
    alpha, bravo, first, _ = _two(scene)
    old = stored_blob(scene, first)
    edit(alpha, first, "the newer version")
    alpha.sync()
    bravo.sync()
    assert contents(bravo)[first] == "the newer version"
    scene.proxy.on("GET", r"/pull$", inject(old), times=1)
    report = bravo.sync()
    assert report.stale == 1
    assert report.applied == 0
    assert contents(bravo)[first] == "the newer version"


FORGERIES: dict[str, Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]] = {
    "moved to another memory": lambda a, b: dict(a, memory_id=b["memory_id"]),
    "moved from another vault": lambda a, b: dict(a, vault_id="another-vault"),
    "deleted flipped": lambda a, b: dict(a, deleted=not a["deleted"]),
    "clock raised": lambda a, b: dict(a, vector_clock=a["vector_clock"] + 100),
    "invalid base64": lambda a, b: dict(a, ciphertext="***not base64***"),
    "another blob's hmac": lambda a, b: dict(a, hmac=b["hmac"]),
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_forged_blob_is_skipped_and_reported(scene: Scene, forgery: str) -> None:
    _, bravo, first, second = _two(scene)
    before = contents(bravo)
    a, b = stored_blob(scene, first), stored_blob(scene, second)
    scene.proxy.on("GET", r"/pull$", inject(FORGERIES[forgery](a, b)), times=1)
    report = bravo.sync()
    assert report.invalid == 1
    assert report.applied == 0
    assert contents(bravo) == before
    with bravo.open() as session:
        assert len(session.state.skipped) == 1
    # the honest counterpart: the genuine blob, injected the same way, is a normal version
    scene.proxy.on("GET", r"/pull$", inject(a), times=1)
    assert bravo.sync().invalid == 0


ODD_ANSWERS: dict[str, Answer] = {
    "wrong JSON types": Answer(200, {"blobs": "none", "has_more": "no", "cursor": "7"}),
    "a clock that is a string": Answer(
        200, {"blobs": [{"vault_id": "v", "vector_clock": "7"}], "has_more": False}
    ),
    "not JSON at all": Answer(200, b"\x00\xff garbage"),
    "an HTML page with 200": Answer(
        200, b"<html><body>Welcome</body></html>", {"content-type": "text/html"}
    ),
}


@pytest.mark.parametrize("odd", list(ODD_ANSWERS))
def test_an_answer_of_the_wrong_shape_is_refused(scene: Scene, odd: str) -> None:
    alpha, bravo, _, _ = _two(scene)
    before = contents(bravo)
    add(alpha, "third")
    alpha.sync()
    scene.proxy.on("GET", r"/pull$", lambda e: ODD_ANSWERS[odd], forward=False)
    with pytest.raises(ProtocolError):
        bravo.sync()
    assert contents(bravo) == before
    scene.proxy.honest()
    assert bravo.sync().applied == 1


def test_an_html_error_page_is_an_error_with_its_excerpt(scene: Scene) -> None:
    _, bravo, _, _ = _two(scene)
    html = b"<html><title>403 Forbidden</title><body>nginx</body></html>"
    scene.proxy.on(
        "GET", r"/pull$", lambda e: Answer(403, html, {"content-type": "text/html"}), times=1
    )
    with pytest.raises(RelayError, match="403 Forbidden"):
        bravo.sync()
    scene.proxy.on(
        "GET", r"/pull$", lambda e: Answer(502, html, {"content-type": "text/html"}), times=2
    )  # a proxy's 5xx page: retried (max_retries=1), then given up with its excerpt
    with pytest.raises(RelayUnavailableError, match="HTTP 502"):
        bravo.sync()
    assert bravo.sync().applied == 0  # honest again: nothing lost, nothing to apply


def test_a_slow_answer_times_out_and_the_next_sync_recovers(scene: Scene) -> None:
    alpha, bravo, _, _ = _two(scene)
    add(alpha, "third")
    alpha.sync()
    scene.proxy.on("GET", r"/pull$", lambda e: Answer(200, b"{}", delay=3.0), forward=False)
    with (
        bravo.open() as session,
        session.relay(max_retries=1, backoff_base=0, timeout=0.5) as relay,
        pytest.raises(RelayUnavailableError),
    ):
        session.syncer(relay).sync()
    scene.proxy.honest()
    assert bravo.sync().applied == 1
