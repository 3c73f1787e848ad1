"""A relay restored from an older backup (issue 13 item 3; PROTOCOL §17).

The restore drill of docs/self-hosting.md, with two devices: back up, keep working on both
devices, restore the backup, start the relay again. Every memory either device holds must
be back on the relay and on both devices with no manual step, and each device says once
what happened. The faster cases lie about the generation or the vault's sequence through
the proxy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from engram_sync.client._session import VaultSession
from tests.deploy.test_backup_restore import relay_cli
from tests.e2e.conftest import PASSPHRASE, DeviceHandle
from tests.e2e.helpers import add, contents, edit
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import rewrite_json
from tests.relay.conftest import ADMIN_KEY, Relay, base_config
from tests.reliability.support import RelayProcess


def device(tmp_path: Path, url: str, database_url: str, name: str) -> DeviceHandle:
    path = tmp_path / name
    with VaultSession.open(path, PASSPHRASE, create=True) as session:
        session.link(url, ADMIN_KEY, "restore-drill", name)
    return DeviceHandle(name, path, Relay(url, database_url, base_config(database_url)))


def live_blobs(relay: Relay, vault_id: str) -> int:
    """Live blobs the relay holds for the vault."""
    (row,) = relay.sql(
        "SELECT count(*) AS n FROM blobs WHERE vault_id = $1 AND NOT deleted", vault_id
    )
    return int(row["n"])


def test_the_readme_restore_drill_loses_nothing(fresh_database_url: str, tmp_path: Path) -> None:
    database = fresh_database_url
    process = RelayProcess(database, log_path=tmp_path / "relay.log")
    process.start()
    alpha = device(tmp_path, process.url, database, "alpha")
    bravo = device(tmp_path, process.url, database, "bravo")
    try:
        before = [add(alpha, f"before backup {i}") for i in range(3)]
        alpha.sync()
        bravo.sync()
        backup = tmp_path / "relay.dump"
        done = relay_cli("backup", "--output", str(backup), "--database-url", database)
        assert done.returncode == 0, done.stderr.decode()

        after_alpha = [add(alpha, f"alpha after backup {i}") for i in range(4)]
        edit(alpha, before[0], "edited after the backup")
        alpha.sync()
        after_bravo = [add(bravo, f"bravo after backup {i}") for i in range(2)]
        bravo.sync()
        alpha.sync()
        assert len(contents(alpha)) == len(contents(bravo)) == 9
        expected = contents(alpha)

        process.stop()
        done = relay_cli("restore", "--input", str(backup), "--yes", "--database-url", database)
        assert done.returncode == 0, done.stderr.decode()
        process.start()
        assert live_blobs(alpha.relay, "restore-drill") == 3  # the backup's state

        reports = [alpha.sync(), bravo.sync(), alpha.sync(), bravo.sync()]
        assert [r.restored for r in reports] == [True, True, False, False]  # told once
        assert reports[0].repushed >= 5  # alpha's 4 new and its edit (and bravo's 2)
        # a memory added after the restore reaches the other device (cursor not stuck)
        late = add(alpha, "after the restore")
        alpha.sync()
        bravo.sync()
        expected[late] = "after the restore"
        assert contents(alpha) == expected
        assert contents(bravo) == expected
        assert live_blobs(alpha.relay, "restore-drill") == len(expected)
        assert set(after_alpha) | set(after_bravo) <= set(contents(bravo))
        for handle in (alpha, bravo):
            with handle.open() as session:
                assert session.state.last_error is None
    finally:
        alpha.restart()
        bravo.restart()
        process.stop()


def test_a_new_generation_makes_the_device_repair_the_relay(scene: Scene) -> None:
    alpha = scene.device("alpha")
    ids = [add(alpha, f"memory {i}") for i in range(4)]
    alpha.sync()
    first = alpha.sync()
    assert not first.restored  # the honest counterpart: same generation, nothing to repair
    # the relay loses two memories (as a restore would) and announces a new generation
    scene.relay.sql(
        "DELETE FROM blobs WHERE vault_id = $1 AND memory_id = ANY($2)", scene.vault_id, ids[:2]
    )

    def new_generation(value: dict[str, object]) -> None:
        value["generation"] = "f" * 32

    scene.proxy.on("GET", r"/pull$", rewrite_json(new_generation))
    scene.proxy.on("POST", r"/push$", rewrite_json(new_generation))
    report = alpha.sync()
    assert report.restored
    assert report.repushed == 2
    (row,) = scene.relay.sql(
        "SELECT count(*) AS n FROM blobs WHERE vault_id = $1 AND memory_id = ANY($2)",
        scene.vault_id,
        ids,
    )
    assert row["n"] == 4
    again = alpha.sync()  # the new generation is the known one now
    assert not again.restored


def test_a_vault_sequence_below_the_cursor_is_a_restore(scene: Scene) -> None:
    alpha = scene.device("alpha")
    for i in range(3):
        add(alpha, f"memory {i}")
    alpha.sync()
    assert alpha.sync().cursor == 3

    def head_went_back(value: dict[str, object]) -> None:
        value["head"] = 1
        value["cursor"] = min(int(str(value["cursor"])), 1)
        value.pop("generation", None)

    scene.proxy.on("GET", r"/pull$", rewrite_json(head_went_back), times=1)
    report = alpha.sync()
    assert report.restored
    assert len(contents(alpha)) == 3


def test_the_cli_says_once_that_the_relay_lost_changes(scene: Scene) -> None:
    alpha = scene.device("alpha")
    add(alpha, "kept")
    alpha.sync()
    alpha.sync()
    alpha.restart()  # the CLI opens the vault itself
    scene.relay.sql("DELETE FROM blobs WHERE vault_id = $1", scene.vault_id)

    def new_generation(value: dict[str, object]) -> None:
        value["generation"] = "e" * 32

    scene.proxy.on("GET", r"/pull$", rewrite_json(new_generation))
    scene.proxy.on("POST", r"/push$", rewrite_json(new_generation))
    cli = [str(Path(sys.executable).parent / "engram-sync"), "--vault", str(alpha.path)]
    env = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, *args], env=env, capture_output=True, text=True, timeout=120, check=False
        )

    first, second = run("sync"), run("sync")
    assert first.returncode == 0, first.stderr
    assert "pulled everything again and pushed back 1 version(s)" in first.stderr
    assert second.returncode == 0, second.stderr
    assert "pulled everything again" not in second.stderr  # told once
    status = json.loads(run("status", "--json").stdout)
    assert status["last_error"] is None
    assert live_blobs(scene.relay, scene.vault_id) == 1
