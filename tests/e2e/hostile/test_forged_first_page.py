"""A lying relay and the key check of a device's first pull (issue 35, PROTOCOL §8).

A device pulling from cursor 0 stops when its keys open none of the first page's blobs
(a mistyped passphrase, a member before its handoff). A relay can forge every blob of
that page: the device then stops too, applies nothing and keeps its cursor at 0, so the
next honest answer brings everything (no memory is skipped for good). One forged blob
among genuine ones does not stop it: it is skipped and reported, the rest applied.
"""

from __future__ import annotations

import pytest

from engram_sync.client._vault.vault_key_store import KeysDoNotOpenVaultError
from tests.e2e.helpers import add, contents
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.test_forged_pages import inject, stored_blob


def test_a_first_page_of_forged_blobs_moves_nothing_and_the_next_sync_gets_everything(
    scene: Scene,
) -> None:
    alpha, bravo = scene.device("alpha"), scene.device("bravo")
    first, second = add(alpha, "first memory"), add(alpha, "second memory")
    alpha.sync()
    a, b = stored_blob(scene, first), stored_blob(scene, second)
    forged = [dict(a, hmac=b["hmac"]), dict(b, hmac=a["hmac"])]
    scene.proxy.on("GET", r"/pull$", inject(*forged), times=1)
    with pytest.raises(KeysDoNotOpenVaultError, match="nothing was pulled or pushed"):
        bravo.sync()
    assert contents(bravo) == {}
    with bravo.open() as session:
        assert session.state.cursor == 0
        assert session.state.skipped == []
    # the honest counterpart: the relay's genuine answer brings both
    assert bravo.sync().applied == 2
    assert contents(bravo) == {first: "first memory", second: "second memory"}


def test_one_forged_blob_on_the_first_page_is_skipped_and_the_rest_applied(
    scene: Scene,
) -> None:
    alpha, bravo = scene.device("alpha"), scene.device("bravo")
    first, second = add(alpha, "first memory"), add(alpha, "second memory")
    alpha.sync()
    a, b = stored_blob(scene, first), stored_blob(scene, second)
    scene.proxy.on("GET", r"/pull$", inject(dict(a, hmac=b["hmac"]), b), times=1)
    report = bravo.sync()
    assert (report.invalid, report.applied) == (1, 1)
    with bravo.open() as session:
        [skipped] = session.state.skipped
        assert skipped.memory_id == first
        assert "sealed under other keys" in skipped.reason
