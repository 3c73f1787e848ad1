"""`strict_local` never leaves the device (issue 35; PROTOCOL §8; docs/privacy.md).

Through the real `engram-sync` executable and the library, against the real relay process
behind the recording proxy: a strict_local memory's id and text are in no request body the
device sent (add + sync, edit + sync, delete + sync, watch, import, the library, a re-key)
and in no row of the relay's PostgreSQL, while a cloud_first memory of the same vault is
found in both (the proof that the search is real). A level changes both ways (made
strict_local its later versions stay local; made syncing again it is pushed), `retract`
removes the copy already synced from the relay and the other devices while the memory
stays here, and a lying relay sending a blob for a strict_local memory's id changes
nothing but a conflict copy.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

from engram_sync.client import Vault
from engram_sync.client._render import conflict_line
from engram_sync.client._vault import conflicts as conflict_ops
from engram_sync.client._vault import store
from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.padding import pad_plaintext
from engram_sync.shared_format.plaintext import encode_memory, tombstone_plaintext
from engram_sync.shared_format.sync_keys import vault_id_v2
from tests.e2e.conftest import PASSPHRASE as LIB_PASSPHRASE
from tests.e2e.helpers import add, conflicts, contents
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.test_forged_pages import inject
from tests.e2e.test_import_export_cli import EXE, PASSPHRASE, cli, ok
from tests.relay.conftest import ADMIN_KEY
from tests.reliability.support import database_text


def _relay_database(scene: Scene) -> str:
    """Every column of every row of the relay's PostgreSQL, as text."""
    return database_text(scene.relay.database_url)


def _sent(scene: Scene) -> str:
    """Every request the devices sent through the proxy: method, path, query and body."""
    return "\n".join(
        f"{e.method} {e.path} {json.dumps(e.query)} {e.request_body.decode('utf-8', 'replace')}"
        for e in scene.proxy.log
    )


def _relay_blobs(scene: Scene, vault_id: str) -> dict[str, bool]:
    """memory id -> deleted, of the blobs the relay's database holds for a vault."""
    rows = scene.relay.sql("SELECT memory_id, deleted FROM blobs WHERE vault_id = $1", vault_id)
    return {r["memory_id"]: r["deleted"] for r in rows}


def _assert_never_left(scene: Scene, *secrets_: str) -> None:
    database, sent = _relay_database(scene), _sent(scene)
    for secret in secrets_:
        assert secret not in database, secret
        assert secret not in sent, secret


def _linked(scene: Scene, name: str) -> Path:
    path = scene.tmp_path / name
    ok(cli(path, "init"))
    ok(cli(path, "link", "--relay", scene.proxy.url, "--api-key", ADMIN_KEY,
           "--vault-id", scene.vault_id, "--label", name))  # fmt: skip
    return path


def test_strict_local_never_leaves_through_the_cli(scene: Scene) -> None:
    alpha, bravo = _linked(scene, "alpha"), _linked(scene, "bravo")
    private = f"private-{secrets.token_hex(6)}"
    shared = f"shared-{secrets.token_hex(6)}"
    kept = ok(cli(alpha, "add", "--privacy", "strict_local", f"kept here {private}")).strip()
    gone = ok(cli(alpha, "add", "--privacy", "strict_local", f"deleted {private}")).strip()
    open_id = ok(cli(alpha, "add", f"open {shared}")).strip()
    ok(cli(alpha, "sync"))
    ok(cli(alpha, "edit", kept, f"edited here {private}"))
    ok(cli(alpha, "delete", gone))  # never synced: no tombstone, its id never leaves
    ok(cli(alpha, "import", "-", stdin=json.dumps(
        {"content": f"imported {private}", "privacy_level": "strict_local"}) + "\n"))  # fmt: skip
    report = json.loads(ok(cli(alpha, "sync", "--json")))
    assert report["pushed"] == 0, report
    assert report["digest"]["matched"] is True, report
    ok(cli(bravo, "sync"))

    # the level is shown everywhere, and counted
    listed = {m["id"]: m for m in json.loads(ok(cli(alpha, "list", "--json")))}
    assert listed[kept]["privacy_level"] == "strict_local"
    assert listed[open_id]["privacy_level"] == "cloud_first"
    assert f"{kept}  " in ok(cli(alpha, "list"))
    assert "[strict_local]" in next(
        line for line in ok(cli(alpha, "list")).splitlines() if line.startswith(kept)
    )
    found = json.loads(ok(cli(alpha, "search", "edited", "--json")))["results"]
    assert [(m["id"], m["privacy_level"]) for m in found] == [(kept, "strict_local")]
    assert json.loads(ok(cli(alpha, "show", kept)))["privacy_level"] == "strict_local"
    status = json.loads(ok(cli(alpha, "status", "--json")))
    assert (status["local_only"], status["pending_pushes"]) == (2, 0)  # kept, imported
    assert "local_only: 2" in ok(cli(alpha, "status"))

    refused = cli(alpha, "retract", kept)  # nothing elsewhere: its id must not leave now
    assert refused.returncode == 1
    assert f"{kept} never synced: there is no copy elsewhere to retract" in refused.stderr
    assert "Traceback" not in refused.stderr

    # the proof: neither the relay's database nor any request holds them ...
    _assert_never_left(scene, kept, gone, private)
    assert set(_relay_blobs(scene, scene.vault_id)) == {open_id}
    # ... while the cloud_first memory is found in both (the search is real)
    assert open_id in _relay_database(scene)
    assert open_id in _sent(scene)
    bravo_ids = {m["id"] for m in json.loads(ok(cli(bravo, "list", "--json")))}
    assert bravo_ids == {open_id}


def test_watch_pushes_the_rest_and_never_a_strict_local_memory(scene: Scene) -> None:
    alpha = _linked(scene, "alpha")
    private = f"private-{secrets.token_hex(6)}"
    kept = ok(cli(alpha, "add", "--privacy", "strict_local", f"watched {private}")).strip()
    open_id = ok(cli(alpha, "add", "pushed by watch")).strip()
    env = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE)
    env.pop("ENGRAM_VAULT", None)
    watcher = subprocess.Popen(
        [EXE, "--vault", str(alpha), "watch", "--interval", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while open_id not in _relay_blobs(scene, scene.vault_id):
            assert watcher.poll() is None, watcher.communicate()
            assert time.monotonic() < deadline, "watch never pushed"
            time.sleep(0.3)
        time.sleep(2)  # another round or two of the loop
    finally:
        watcher.send_signal(signal.SIGTERM)
        watcher.communicate(timeout=60)
    _assert_never_left(scene, kept, private)
    assert open_id in _sent(scene)


def test_a_level_changes_both_ways_and_retract_removes_the_synced_copy(scene: Scene) -> None:
    alpha, bravo = _linked(scene, "alpha"), _linked(scene, "bravo")
    private = f"private-{secrets.token_hex(6)}"
    memory = ok(cli(alpha, "add", "was shared once")).strip()
    ok(cli(alpha, "sync"))
    ok(cli(bravo, "sync"))
    assert _relay_blobs(scene, scene.vault_id) == {memory: False}

    changed = ok(cli(alpha, "edit", memory, "--privacy", "strict_local"))
    assert f"{memory} is now strict_local" in changed
    assert f"`engram-sync retract {memory}` removes it there" in changed
    ok(cli(alpha, "edit", memory, f"now private {private}"))
    sent_before = len(scene.proxy.log)
    report = json.loads(ok(cli(alpha, "sync", "--json")))
    assert report["pushed"] == 0
    assert report["digest"]["matched"] is True  # the relay's copy is the one it was given
    later = "\n".join(e.request_body.decode() for e in scene.proxy.log[sent_before:])
    assert memory not in later  # no later version left, not even its id
    ok(cli(bravo, "sync"))
    assert [m["content"] for m in json.loads(ok(cli(bravo, "list", "--json")))] == [
        "was shared once"
    ]  # the copy already synced stays on the other device

    # retract: a deletion is pushed, the memory stays here, strict_local
    retracted = ok(cli(alpha, "retract", memory))
    assert f"retracted {memory}" in retracted
    assert _relay_blobs(scene, scene.vault_id) == {memory: True}
    mine = json.loads(ok(cli(alpha, "show", memory)))
    assert (mine["content"], mine["privacy_level"]) == (f"now private {private}", "strict_local")
    ok(cli(bravo, "sync"))
    assert json.loads(ok(cli(bravo, "list", "--json"))) == []
    again = json.loads(ok(cli(alpha, "sync", "--json")))
    assert (again["pushed"], again["digest"]["matched"]) == (0, True)
    _assert_never_left(scene, private)

    # and back: made cloud_first, it is pushed at the next sync
    back = ok(cli(alpha, "edit", memory, "--privacy", "cloud_first"))
    assert f"{memory} is now cloud_first: the next sync pushes it" in back
    assert json.loads(ok(cli(alpha, "sync", "--json")))["pushed"] == 1
    assert _relay_blobs(scene, scene.vault_id) == {memory: False}
    ok(cli(bravo, "sync"))
    assert [m["content"] for m in json.loads(ok(cli(bravo, "list", "--json")))] == [
        f"now private {private}"
    ]

    # a retract of a memory that is not strict_local: one line, what to do
    refused = cli(alpha, "retract", memory)
    assert refused.returncode == 1
    assert "not strict_local" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_deleting_a_synced_then_strict_local_memory_stays_local(scene: Scene) -> None:
    alpha, bravo = _linked(scene, "alpha"), _linked(scene, "bravo")
    memory = ok(cli(alpha, "add", "synced, then private, then deleted")).strip()
    ok(cli(alpha, "sync"))
    ok(cli(alpha, "edit", memory, "--privacy", "strict_local"))
    ok(cli(alpha, "delete", memory))
    sent_before = len(scene.proxy.log)
    report = json.loads(ok(cli(alpha, "sync", "--json")))
    assert report["pushed"] == 0
    assert report["digest"]["matched"] is True
    assert report["digest"]["fetched"] == 0  # the relay's copy is not brought back either
    assert memory not in "\n".join(e.request_body.decode() for e in scene.proxy.log[sent_before:])
    assert _relay_blobs(scene, scene.vault_id) == {memory: False}  # no tombstone
    assert json.loads(ok(cli(alpha, "list", "--json"))) == []
    ok(cli(bravo, "sync"))
    assert [m["id"] for m in json.loads(ok(cli(bravo, "list", "--json")))] == [memory]


def _forged(scene: Scene, memory_id: str, content: str) -> Any:
    """A blob a key holder made for `memory_id`, from another device, with a high clock."""
    with Vault.open(scene.tmp_path / "alpha", LIB_PASSPHRASE) as vault:
        memory = vault.get(memory_id)
        cipher = BlobCipher(vault._session.keys)
    assert memory is not None
    remote = msgspec.structs.replace(memory, content=content, privacy_level="cloud_first")
    blob = cipher.seal(
        pad_plaintext(encode_memory(remote)), vault_id=scene.vault_id, memory_id=memory_id,
        device_id=str(uuid.uuid4()), vector_clock=1000, deleted=False,
    )  # fmt: skip
    return msgspec.to_builtins(blob)


def test_a_pulled_version_never_overwrites_a_strict_local_memory(scene: Scene) -> None:
    alpha = scene.device("alpha")
    kept = add(alpha, "mine, private", privacy_level="strict_local")
    honest = add(alpha, "mine, shared")
    alpha.sync()
    alpha.restart()
    forged = _forged(scene, kept, "the relay's version")
    scene.proxy.on("GET", r"/pull$", inject(forged), times=1)
    report = alpha.sync()
    assert report.applied == 0
    assert report.conflicts == 1
    assert contents(alpha)[kept] == "mine, private"
    with alpha.open() as session:
        row = store.get_row(session.vault.conn, kept)
    assert row is not None
    assert row["privacy_level"] == "strict_local"
    (copy,) = conflicts(alpha)  # the other version, kept where the person can restore it
    assert copy[0] == kept
    assert "the relay's version" in copy[1]
    with alpha.open() as session:  # and listed as what it is: not a local version that lost
        (listed,) = conflict_ops.list_conflicts(session.vault.conn)
    assert (listed.kept_out, listed.local_content) == (True, "the relay's version")
    assert "kept out (strict_local here)" in conflict_line(listed)
    # the same blob again: known, not kept a second time
    scene.proxy.on("GET", r"/pull$", inject(forged), times=1)
    again = alpha.sync()
    assert (again.applied, again.conflicts) == (0, 0)
    assert len(conflicts(alpha)) == 1
    # a deletion for it leaves it too
    alpha.restart()
    tomb = _reseal(scene, kept, 1001)
    scene.proxy.on("GET", r"/pull$", inject(tomb), times=1)
    alpha.sync()
    assert contents(alpha) == {kept: "mine, private", honest: "mine, shared"}


def _reseal(scene: Scene, memory_id: str, clock: int) -> Any:
    with Vault.open(scene.tmp_path / "alpha", LIB_PASSPHRASE) as vault:
        cipher = BlobCipher(vault._session.keys)
    blob = cipher.seal(
        pad_plaintext(tombstone_plaintext(memory_id)), vault_id=scene.vault_id,
        memory_id=memory_id, device_id=str(uuid.uuid4()), vector_clock=clock, deleted=True,
    )  # fmt: skip
    return msgspec.to_builtins(blob)


def test_the_library_keeps_strict_local_memories_local(scene: Scene) -> None:
    path = scene.tmp_path / "library"
    private = f"private-{secrets.token_hex(6)}"
    with Vault.open(path, LIB_PASSPHRASE, create=True) as vault:
        vault.link(scene.proxy.url, ADMIN_KEY, vault_id=scene.vault_id)
        kept = vault.add(f"library {private}", privacy_level="strict_local")
        later = vault.add("library, shared first")
        shared = vault.add("library, shared")
        assert vault.sync().pushed == 2
        assert vault.edit(later, privacy_level="strict_local")
        assert vault.edit(later, f"edited {private}")
        assert vault.sync().pushed == 0
        assert vault.edit(kept, privacy_level="hybrid")  # syncing again: pushed
        assert vault.sync().pushed == 1
        assert vault.edit(kept, privacy_level="strict_local")
    _assert_never_left(scene, private)
    assert set(_relay_blobs(scene, scene.vault_id)) == {kept, later, shared}


def _as(passphrase: str, vault: Path, *args: str, **env: str) -> str:
    """`engram-sync` on a vault of another passphrase than the module's."""
    full = dict(os.environ, ENGRAM_PASSPHRASE=passphrase, **env)
    full.pop("ENGRAM_VAULT", None)
    done = subprocess.run(
        [EXE, "--vault", str(vault), *args], env=full, capture_output=True, text=True,
        timeout=180, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return ok(done)


def test_a_rekey_copies_no_strict_local_memory(scene: Scene) -> None:
    old = f"strict rekey {secrets.token_hex(4)}"
    alpha = scene.tmp_path / "alpha"
    _as(old, alpha, "init")
    _as(old, alpha, "link", "--relay", scene.proxy.url, "--api-key", ADMIN_KEY,
        "--vault-id", vault_id_v2(old))  # fmt: skip
    private = f"private-{secrets.token_hex(6)}"
    kept = _as(old, alpha, "add", "--privacy", "strict_local", f"never {private}").strip()
    later = _as(old, alpha, "add", "synced before it became private").strip()
    shared = _as(old, alpha, "add", "copied by the re-key").strip()
    _as(old, alpha, "sync")
    _as(old, alpha, "edit", later, "--privacy", "strict_local")
    _as(old, alpha, "edit", later, f"later {private}")
    sent_before = len(scene.proxy.log)

    new = f"strict rekey new {secrets.token_hex(4)}"
    summary = json.loads(_as(old, alpha, "rekey", "--json", ENGRAM_NEW_PASSPHRASE=new))
    new_id = vault_id_v2(new)
    assert summary["new_vault_id"] == new_id
    assert set(_relay_blobs(scene, new_id)) == {shared}
    during = "\n".join(e.request_body.decode() for e in scene.proxy.log[sent_before:])
    assert later not in during  # not even the version the old vault held
    assert shared in during
    _assert_never_left(scene, kept, private)
    after = json.loads(_as(new, alpha, "sync", "--json"))
    assert (after["pushed"], after["digest"]["matched"]) == (0, True)
    listed = {m["id"] for m in json.loads(_as(new, alpha, "list", "--json"))}
    assert listed == {kept, later, shared}


def _link(device: Any, source: str, target: str) -> None:
    with device.open() as session, session.vault.transaction() as conn:
        conn.execute(
            "INSERT INTO engram_links (source_id, target_id, weight, link_type)"
            " VALUES (?, ?, 0.5, 'associative')",
            (source, target),
        )
        store.mark_edited(conn, source, store.next_modified_at())


def _links(device: Any, source: str) -> set[str]:
    with device.open() as session:
        conn = session.vault.conn
        return {
            row[0]
            for table in ("engram_links", "sync_pending_links")
            for row in conn.execute(
                f"SELECT target_id FROM {table} WHERE source_id = ?",
                (source,),
            )
        }


def test_a_link_to_a_strict_local_memory_stays_on_this_device(scene: Scene) -> None:
    alpha, bravo = scene.device("alpha"), scene.device("bravo")
    kept = add(alpha, "private target", privacy_level="strict_local")
    shared = add(alpha, "shared source")
    other = add(alpha, "shared target")
    _link(alpha, shared, kept)
    _link(alpha, shared, other)
    alpha.sync()
    bravo.sync()
    assert _links(bravo, shared) == {other}  # the strict_local id did not travel
    edit_on_bravo = "shared source, edited on bravo"
    with bravo.open() as session, session.vault.transaction() as conn:
        assert store.edit_memory(conn, shared, edit_on_bravo)
    bravo.sync()
    alpha.sync()
    assert contents(alpha)[shared] == edit_on_bravo
    assert _links(alpha, shared) == {kept, other}  # bravo's version did not drop it here
