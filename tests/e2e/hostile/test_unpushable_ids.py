"""One memory the relay refuses must not block every push (issue 31, finding 6).

The relay refuses a whole push for one structurally invalid blob (PROTOCOL §6 step 1),
e.g. an id with a control character. A vault can hold such a row (written before the
import checked ids, or by another tool writing engrams.db): `engram-sync sync` through
the real CLI and the real relay process pushes every other memory, names the refused one
in one line, keeps it in the vault, exits 3, and the next sync is not wedged. Behind the
lying proxy, a relay with a stricter rule than ours (a 400 `invalid_blob` naming a blob by
its index) gets the same treatment: that blob is kept local, the rest pushed; and a
pulled blob with such an id (a lying relay and a key holder) is skipped, never applied,
and `status` shows its id escaped.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import msgspec

from engram_sync.client._vault import store
from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.padding import pad_plaintext
from engram_sync.shared_format.plaintext import encode_memory
from engram_sync.shared_format.vault import open_vault
from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add, contents
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import Answer, Exchange
from tests.e2e.hostile.test_forged_pages import inject
from tests.e2e.test_import_export_cli import EXE, PASSPHRASE, cli, ok
from tests.relay.conftest import ADMIN_KEY

BAD_ID = "mem_bad\x07id"  # a BEL: the relay refuses control characters in ids
EXIT_UNPUSHABLE = 3


def _linked_vault(path: Path, url: str, vault_id: str, label: str) -> Path:
    ok(cli(path, "init"))
    ok(cli(path, "link", "--relay", url, "--api-key", ADMIN_KEY,
           "--vault-id", vault_id, "--label", label))  # fmt: skip
    return path


def _import(vault: Path, *contents: str) -> None:
    lines = "".join(json.dumps({"content": text}) + "\n" for text in contents)
    assert f"added {len(contents)}" in ok(cli(vault, "import", "-", stdin=lines))


def _write_row_with_id(vault: Path, memory_id: str, content: str) -> None:
    """A row as another tool would write it, straight into the SQLCipher database."""
    with open_vault(vault, PASSPHRASE) as opened:
        conn = opened.conn
        conn.execute(
            "INSERT INTO engrams (id, layer, source, privacy_level, content, context,"
            " created_at, tags, modified_at) VALUES (?, 'episodic', 'user', 'cloud_first', ?,"
            " '{}', '2026-05-05T05:05:05.000000+00:00', '[]',"
            " '2026-05-05T05:05:05.000000+00:00')",
            (memory_id, content),
        )
        conn.execute(
            "INSERT INTO engrams_fts (rowid, id, content)"
            " SELECT rowid, id, content FROM engrams WHERE id = ?",
            (memory_id,),
        )


def _ids(vault: Path) -> set[str]:
    with open_vault(vault, PASSPHRASE) as opened:
        return {row[0] for row in opened.conn.execute("SELECT id FROM engrams")}


def test_a_bad_id_row_is_kept_local_and_the_rest_is_pushed(scene: Scene) -> None:
    url = scene.relay.url  # the real relay process, no proxy in between
    alpha = _linked_vault(scene.tmp_path / "alpha", url, scene.vault_id, "alpha")
    bravo = _linked_vault(scene.tmp_path / "bravo", url, scene.vault_id, "bravo")
    _import(alpha, *(f"good memory {n}" for n in range(10)))
    _write_row_with_id(alpha, BAD_ID, "a memory whose id no relay accepts")

    synced = cli(alpha, "sync")
    assert synced.returncode == EXIT_UNPUSHABLE, synced.stdout + synced.stderr
    assert "Traceback" not in synced.stderr
    assert "pushed 10" in synced.stdout
    refused = [line for line in synced.stderr.splitlines() if "not pushed" in line]
    assert len(refused) == 1, synced.stderr
    assert "'mem_bad\\x07id'" in refused[0]  # the id shown escaped, on one line
    assert "control characters" in refused[0]
    assert "which no relay accepts" in refused[0]  # set aside before sending: no 400 first
    assert "\x07" not in synced.stderr

    assert BAD_ID in _ids(alpha)  # kept, never deleted
    pulled = json.loads(ok(cli(bravo, "sync", "--json")))
    assert pulled["applied"] == 10
    assert BAD_ID not in _ids(bravo)

    # the next sync is not wedged: a new memory goes, the bad one is named again
    _import(alpha, "written after the first sync")
    again = cli(alpha, "sync", "--json")
    assert again.returncode == EXIT_UNPUSHABLE, again.stdout + again.stderr
    report = json.loads(again.stdout)
    assert report["pushed"] == 1
    assert [u["memory_id"] for u in report["unpushable"]] == [BAD_ID]
    assert json.loads(ok(cli(bravo, "sync", "--json")))["applied"] == 1
    status = json.loads(ok(cli(alpha, "status", "--json")))
    assert status["pending_pushes"] == 1  # the bad one, still waiting, still here

    # the honest case: once the row is gone, a sync is clean again
    with open_vault(alpha, PASSPHRASE) as opened:
        opened.conn.execute("DELETE FROM engrams WHERE id = ?", (BAD_ID,))
    clean = json.loads(ok(cli(alpha, "sync", "--json")))
    assert clean["unpushable"] == []


def test_a_bad_id_deletion_is_kept_local_too(scene: Scene) -> None:
    alpha = _linked_vault(scene.tmp_path / "alpha", scene.relay.url, scene.vault_id, "alpha")
    _import(alpha, "a good memory")
    with open_vault(alpha, PASSPHRASE) as opened:
        opened.conn.execute(
            "INSERT INTO tombstones (id, deleted_at) VALUES (?, ?), (?, ?)",
            (BAD_ID, "2026-05-05T05:05:05.000000+00:00",
             "mem_good_deletion", "2026-05-05T05:05:06.000000+00:00"),
        )  # fmt: skip
    synced = cli(alpha, "sync", "--json")
    assert synced.returncode == EXIT_UNPUSHABLE, synced.stdout + synced.stderr
    report = json.loads(synced.stdout)
    assert report["pushed"] == 2  # the memory and the good deletion
    assert [u["memory_id"] for u in report["unpushable"]] == [BAD_ID]
    assert "which no relay accepts" in report["unpushable"][0]["reason"]
    status = json.loads(ok(cli(alpha, "status", "--json")))
    assert status["pending_tombstones"] == 1


def test_a_blob_a_stricter_relay_refuses_by_index_is_kept_and_the_rest_pushed(
    scene: Scene,
) -> None:
    alpha = _linked_vault(scene.tmp_path / "alpha", scene.proxy.url, scene.vault_id, "alpha")
    contents = [f"memory {n}" for n in range(6)]
    _import(alpha, *contents)
    with open_vault(alpha, PASSPHRASE) as opened:
        (victim,) = opened.conn.execute(
            "SELECT id FROM engrams WHERE content = 'memory 3'"
        ).fetchone()

    def stricter(exchange: Exchange) -> Answer:
        blobs = exchange.request_json()["blobs"]
        index = [b["memory_id"] for b in blobs].index(victim)
        return Answer(400, {"error": f"blob {index}: memory_id is not allowed here",
                            "code": "invalid_blob", "index": index,
                            "reason": "memory_id is not allowed here"})  # fmt: skip

    scene.proxy.on("POST", r"/push$", stricter, forward=False, times=1)
    synced = cli(alpha, "sync", "--json")
    assert synced.returncode == EXIT_UNPUSHABLE, synced.stdout + synced.stderr
    report = json.loads(synced.stdout)
    assert report["pushed"] == 5
    assert [u["memory_id"] for u in report["unpushable"]] == [victim]
    assert "memory_id is not allowed here" in report["unpushable"][0]["reason"]
    (row,) = scene.relay.sql(
        "SELECT count(*) AS n FROM blobs WHERE vault_id = $1 AND memory_id = $2",
        scene.vault_id, victim,
    )  # fmt: skip
    assert row["n"] == 0
    assert victim in _ids(alpha)

    # the relay takes it after all (the rule was once): the next sync pushes it
    again = json.loads(ok(cli(alpha, "sync", "--json")))
    assert (again["pushed"], again["unpushable"]) == (1, [])


def _sealed(scene: Scene, handle: DeviceHandle, memory_id: str, content: str) -> dict[str, Any]:
    """A blob that verifies under the vault's keys (a key holder made it), for any id."""
    with handle.open() as session:
        cipher = BlobCipher(session.keys)
        (shape,) = store.list_memories(session.vault.conn)
    memory = msgspec.structs.replace(shape, id=memory_id, content=content)
    blob = cipher.seal(
        pad_plaintext(encode_memory(memory)),
        vault_id=scene.vault_id, memory_id=memory_id, device_id=str(uuid.uuid4()),
        vector_clock=7, deleted=False,
    )  # fmt: skip
    return msgspec.to_builtins(blob)  # type: ignore[no-any-return]


def _status(handle: DeviceHandle, *args: str) -> str:
    env = dict(os.environ, ENGRAM_PASSPHRASE=handle.passphrase)
    env.pop("ENGRAM_VAULT", None)
    result = subprocess.run(
        [EXE, "--vault", str(handle.path), "status", *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return ok(result)


def test_a_pulled_blob_with_a_bad_id_is_skipped_and_shown_escaped(scene: Scene) -> None:
    alpha = scene.device("alpha")
    add(alpha, "a memory to copy the shape of")
    alpha.restart()
    evil = "mem_evil\x1b[2J"
    honest, forged = (
        _sealed(scene, alpha, "mem_honest_injected", "an honest injected memory"),
        _sealed(scene, alpha, evil, "a memory whose id no relay accepts"),
    )
    scene.proxy.on("GET", r"/pull$", inject(honest, forged), times=1)
    report = alpha.sync()
    alpha.restart()
    assert (report.applied, report.invalid) == (1, 1)  # the honest one applies
    assert set(contents(alpha).values()) == {
        "a memory to copy the shape of", "an honest injected memory"
    }  # fmt: skip
    status = _status(alpha)
    assert "'mem_evil\\x1b[2J'" in status
    assert "\x1b" not in status
    skipped = json.loads(_status(alpha, "--json"))["skipped_blobs"]
    assert [s["memory_id"] for s in skipped] == [evil]
    assert "control characters" in skipped[0]["reason"]


def test_a_memory_too_large_to_push_is_named_and_exits_3_like_a_refused_one(
    scene: Scene,
) -> None:
    # the same promise for a memory larger than the relay takes (its §11 limit): kept
    # local, named in one line, the rest pushed, exit 3 (it was exit 0 with a count)
    alpha = _linked_vault(scene.tmp_path / "alpha", scene.relay.url, scene.vault_id, "alpha")
    _import(alpha, "a memory of ordinary size")
    big_id = str(uuid.uuid4())
    _write_row_with_id(alpha, big_id, "x" * 1_200_000)  # over the default 1 MiB blob cap

    synced = cli(alpha, "sync")
    assert synced.returncode == EXIT_UNPUSHABLE, synced.stdout + synced.stderr
    assert "pushed 1" in synced.stdout
    (line,) = [line for line in synced.stderr.splitlines() if "not pushed" in line]
    assert big_id in line
    assert "larger than the relay takes" in line
    assert "Traceback" not in synced.stderr
    as_json = cli(alpha, "sync", "--json")
    assert as_json.returncode == EXIT_UNPUSHABLE
    assert json.loads(as_json.stdout)["oversized"] == [big_id]
    assert big_id in _ids(alpha)  # kept, never deleted

    # the honest case: once it is gone, a sync is clean (exit 0)
    with open_vault(alpha, PASSPHRASE) as opened:
        opened.conn.execute("DELETE FROM engrams WHERE id = ?", (big_id,))
    assert json.loads(ok(cli(alpha, "sync", "--json")))["oversized"] == []
