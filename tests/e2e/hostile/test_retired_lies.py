"""A relay that lies about retirement (PROTOCOL §19): its `vault_retired` and `successor`
are only hints. A 410 on a live vault loses no edit (they stay pending and go through once
the relay stops lying); a successor whose blobs do not verify under the key the person gave
is refused loudly and nothing is switched."""

from __future__ import annotations

from typing import Any

import pytest

from engram_sync.client._errors import VaultRetiredError
from engram_sync.client._flows.successor import JoinError, join_with_passphrase
from engram_sync.client._session import VaultSession
from engram_sync.client._vault.store import add_memory, count_to_push
from engram_sync.client._vault.vault_key_store import stored_vault_key
from engram_sync.shared_format.sync_keys import vault_id_v2
from tests.e2e.conftest import PASSPHRASE, DeviceHandle
from tests.e2e.helpers import add, contents
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import Answer, event_stream, rewrite_json
from tests.e2e.live_support import Watcher, wait_for
from tests.relay.conftest import ADMIN_KEY

RETIRED_410 = {"error": "this vault was retired", "code": "vault_retired", "successor": "evil"}


def _pending(device: DeviceHandle) -> tuple[int, int]:
    with device.open() as session:
        return count_to_push(session.vault.conn)


def test_a_lying_410_on_push_loses_no_edit(scene: Scene) -> None:
    alpha, bravo = scene.device("alpha"), scene.device("bravo")
    add(alpha, "before the lie")
    alpha.sync()
    scene.proxy.on("POST", r"/push$", lambda ex: Answer(410, RETIRED_410), forward=False)
    written = [add(alpha, f"during the lie {i}") for i in range(5)]
    with pytest.raises(VaultRetiredError) as raised:
        alpha.sync()
    assert raised.value.successor == "evil"
    assert _pending(alpha) == (5, 0)  # refused: nothing marked pushed, nothing dropped
    with alpha.open() as session:
        assert session.state.retired is not None
        assert session.state.retired.source == "push"
        # the lie names "evil"; a passphrase that gives another vault is not followed
        with pytest.raises(JoinError, match="nothing was switched"):
            join_with_passphrase(session, "any new passphrase")
        assert session.config.vault_id == scene.vault_id

    scene.proxy.honest()  # the honest counterpart: a pull without `retired`, then the push
    report = alpha.sync()
    assert report.pushed == 5
    assert _pending(alpha) == (0, 0)
    with alpha.open() as session:
        assert session.state.retired is None
    bravo.sync()
    assert set(written) <= set(contents(bravo))


def test_a_successor_whose_blobs_do_not_verify_is_refused(scene: Scene) -> None:
    alpha = scene.device("alpha")
    add(alpha, "kept")
    alpha.sync()
    new_passphrase = "the passphrase the person was told"
    successor = vault_id_v2(new_passphrase)
    # the relay's own vault under that id, holding blobs of another passphrase
    intruder = scene.tmp_path / "intruder"
    with VaultSession.open(intruder, "a passphrase of the relay's", create=True) as session:
        session.link(scene.relay.url, ADMIN_KEY, successor, "intruder")
        with session.vault.transaction() as conn:
            add_memory(conn, "planted by the relay")
        with session.relay() as client:
            session.syncer(client).sync()

    def retired(value: dict[str, Any]) -> None:
        value["retired"] = {"successor": successor, "erase_after": "2099-01-01T00:00:00Z"}

    scene.proxy.on("GET", r"/pull$", rewrite_json(retired))
    pending = [add(alpha, f"unpushed {i}") for i in range(3)]
    with pytest.raises(VaultRetiredError) as raised:
        alpha.sync()
    assert raised.value.successor == successor
    with alpha.open() as session:
        with pytest.raises(JoinError, match="without a successor statement"):  # PROTOCOL §19
            join_with_passphrase(session, new_passphrase)
        with pytest.raises(JoinError, match="do not verify"):  # §14 defence in depth
            join_with_passphrase(session, new_passphrase, force=True)
        assert session.config.vault_id == scene.vault_id  # nothing switched
        assert stored_vault_key(session.vault.conn, successor) is None
        assert session.state.rekeyed_from is None
    assert _pending(alpha) == (3, 0)
    alpha.restart()
    VaultSession.open(alpha.path, PASSPHRASE).close()  # engrams.db not rekeyed

    scene.proxy.honest()
    assert alpha.sync().pushed == 3
    assert set(pending) <= set(contents(alpha))


RETIRED_EVENT = b'event: retired\ndata: {"successor": "evil", "erase_after": "2099-01-01"}\n\n'


def _feed_only(scene: Scene) -> None:
    """The device learns of changes from the event stream alone (no digest repairs)."""

    def change(info: dict[str, Any]) -> None:
        info["features"] = [f for f in info["features"] if f not in ("pull-wait", "digest")]

    scene.proxy.on("GET", r"^/v1/info$", rewrite_json(change))


def test_a_retired_event_wakes_the_watch_and_its_pull_ends_it(scene: Scene) -> None:
    """`event: retired` (PROTOCOL §19) makes the watch pull at once (its timer never fires
    here); the pull says the vault is retired, and the watch ends saying so."""
    watching = scene.device("watching")
    _feed_only(scene)
    quiet = scene.proxy.on(
        "GET", r"/events$", lambda e: event_stream(b"retry: 2000\n\n", hold=1), forward=False
    )
    watching.restart()
    watch = Watcher(watching.path).start()
    try:
        assert watch.error is None
        first = len(watch.reports)

        def retired(value: dict[str, Any]) -> None:
            value["retired"] = {"successor": None, "erase_after": "2099-01-01T00:00:00Z"}

        scene.proxy.on("GET", r"/pull$", rewrite_json(retired))
        scene.proxy.on(  # the next stream: the relay's retired event
            "GET", r"/events$", lambda e: event_stream(RETIRED_EVENT, hold=60), forward=False
        )
        quiet.times = quiet.hits  # the quiet stream is not served again
        wait_for(lambda: not watch.running, "the watch to end on the retired vault")
    finally:
        watch.stop()
    assert isinstance(watch.error, VaultRetiredError)
    assert len(watch.reports) == first  # no sync reported success after the event
    with watching.open() as session:
        assert session.state.retired is not None
        assert session.state.retired.source == "pull"


def test_a_lying_retired_event_costs_one_pull_and_the_watch_goes_on(scene: Scene) -> None:
    watching = scene.device("lied-to")
    _feed_only(scene)
    scene.proxy.on(
        "GET",
        r"/events$",
        lambda e: event_stream(b"retry: 2000\n\n", (0.5, RETIRED_EVENT), hold=60),
        forward=False,
        times=1,
    )
    scene.proxy.on(
        "GET", r"/events$", lambda e: event_stream(b"retry: 2000\n\n", hold=60), forward=False
    )
    watching.restart()
    watch = Watcher(watching.path).start()
    try:
        wait_for(lambda: len(watch.reports) >= 2, "the pull the event asked for")
        assert watch.running  # a live vault: the watch goes on
    finally:
        watch.stop()
    assert watch.error is None
    with watching.open() as session:
        assert session.state.retired is None
