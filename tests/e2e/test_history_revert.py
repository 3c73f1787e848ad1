"""Taking writes back across devices (docs/history.md): a real relay, three real SQLCipher
vaults, the library and the `engram-sync` CLI. After a revert every device converges to the
same memories and the same digest (PROTOCOL §18)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from engram_sync.client import Vault
from engram_sync.client._vault import local_writes
from engram_sync.client._vault.held_versions import held_versions
from engram_sync.client._vault.store import add_memory
from engram_sync.shared_format.digest import fold
from tests.e2e.conftest import PASSPHRASE, DeviceHandle
from tests.e2e.helpers import add, contents, sync_all

EXE = str(Path(sys.executable).parent / "engram-sync")


def _digest(device: DeviceHandle) -> tuple[int, int]:
    with device.open() as session:
        return fold(held_versions(session.vault.conn))


def _converged(*devices: DeviceHandle) -> dict[str, str]:
    sync_all(*devices)
    seen = [contents(d) for d in devices]
    assert all(s == seen[0] for s in seen)
    assert len({_digest(d) for d in devices}) == 1
    return seen[0]


def _vault(device: DeviceHandle) -> Vault:
    with device.open() as session:
        return Vault(session)


def test_revert_by_device_across_three_devices_converges(devices: list[DeviceHandle]) -> None:
    alpha, bravo, charlie = devices
    ids = [add(alpha, f"memory {i}", tags=["t"]) for i in range(12)]
    before = _converged(alpha, bravo, charlie)
    # alpha edits one memory the runaway will rewrite again: that edit must survive
    _vault(alpha).edit(ids[0], "alpha's own edit")
    before = _converged(alpha, bravo, charlie)
    runaway = _vault(bravo)
    for memory_id in ids[:6]:
        runaway.edit(memory_id, "poisoned " + memory_id)
    for memory_id in ids[6:10]:
        runaway.delete(memory_id)
    junk = [runaway.add(f"junk {i}") for i in range(3)]
    # charlie (which only pulled the runaway's writes) takes them back for everyone
    after_runaway = _converged(alpha, bravo, charlie)
    assert after_runaway != before
    plan = _vault(charlie).revert(device=bravo.session.device.device_id)  # type: ignore[union-attr]
    assert (plan.count("restore"), plan.count("undelete"), plan.count("delete")) == (6, 4, 3)
    assert plan.unrevertible == []
    assert _converged(alpha, bravo, charlie) == before
    assert contents(alpha)[ids[0]] == "alpha's own edit"
    assert not set(junk) & set(contents(bravo))
    # run again: nothing left to take back, nothing written
    again = _vault(charlie).revert(device=bravo.session.device.device_id)  # type: ignore[union-attr]
    assert again.steps == []


def test_revert_by_tool_takes_back_only_that_tools_writes(devices: list[DeviceHandle]) -> None:
    alpha, bravo, charlie = devices
    ids = [add(alpha, f"note {i}") for i in range(8)]
    before = _converged(alpha, bravo, charlie)
    with bravo.open() as session:
        own = session.device.device_id
        tool = session.writer(source="ai-tool", tool="rogue-tool")
        person = session.writer()
        with session.vault.transaction() as conn:
            for memory_id in ids[:3]:
                local_writes.edit(conn, memory_id, "tool rewrote " + memory_id, None, tool,
                                  own_device=own)  # fmt: skip
            for memory_id in ids[3:5]:
                local_writes.delete(conn, memory_id, tool, own_device=own)
            local_writes.edit(conn, ids[5], "the person's edit", None, person, own_device=own)
            # a memory the tool wrote names it in its context (as the MCP server writes it)
            made = add_memory(conn, "the tool's own memory", source="ai-tool")
            conn.execute(
                "UPDATE engrams SET context = ? WHERE id = ?",
                (json.dumps({"tool": {"name": "rogue-tool", "version": "1"}}), made),
            )
    _converged(alpha, bravo, charlie)
    # on charlie the wire carries the tool only in the memory it wrote (docs/history.md)
    far = _vault(charlie).revert(tool="rogue-tool", dry_run=True)
    assert [(s.memory_id, s.action) for s in far.steps] == [(made, "delete")]
    plan = _vault(bravo).revert(tool="rogue-tool")
    assert (plan.count("restore"), plan.count("undelete"), plan.count("delete")) == (3, 2, 1)
    final = _converged(alpha, bravo, charlie)
    assert final == {**before, ids[5]: "the person's edit"}


_KILL_AFTER_FIRST_BATCH = textwrap.dedent(
    """
    import os, signal, sys
    from engram_sync.client._session import VaultSession
    from engram_sync.client._vault.revert import Selector, plan_revert, run_revert

    path, passphrase, device = sys.argv[1:4]
    session = VaultSession.open(__import__("pathlib").Path(path), passphrase)
    own = session.device.device_id
    plan = plan_revert(session.vault.conn, Selector(device_id=device), own)
    print(len(plan.steps), flush=True)

    def die(done):  # called after each committed batch: the process is killed at once
        os.kill(os.getpid(), signal.SIGKILL)

    run_revert(session.vault, plan.steps, session.writer(), own_device=own, progress=die)
    """
)


def test_a_revert_killed_midway_is_finished_by_its_rerun(
    devices: list[DeviceHandle], tmp_path: Path
) -> None:
    alpha, bravo, charlie = devices
    with alpha.open() as session, session.vault.transaction() as conn:
        ids = [add_memory(conn, f"kept {i}") for i in range(1200)]
    before = _converged(alpha, bravo)
    with bravo.open() as session, session.vault.transaction() as conn:
        own = session.device.device_id
        for memory_id in ids:
            local_writes.delete(conn, memory_id, session.writer(), own_device=own)
    _converged(alpha, bravo)
    alpha.restart()  # the killed process owns the vault now
    killed = subprocess.run(
        [sys.executable, "-c", _KILL_AFTER_FIRST_BATCH, str(alpha.path), PASSPHRASE, own],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    assert killed.stdout.strip() == "1200"
    assert len(contents(alpha)) == 500  # one batch committed, then the kill
    rerun = _cli(alpha, "revert", "--device", own, "--yes")
    assert rerun.returncode == 0, rerun.stderr
    assert "1200" not in rerun.stderr  # the rerun planned only what was left
    assert "700 memories" in rerun.stderr
    with alpha.open() as session:
        reverts = session.vault.conn.execute(
            "SELECT memory_id, count(*) FROM sync_history WHERE reason = 'revert'"
            " GROUP BY memory_id HAVING count(*) > 1"
        ).fetchall()
    assert reverts == []  # no memory reverted twice
    assert _converged(alpha, bravo, charlie) == before


def _cli(device: DeviceHandle, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE, HOME=str(device.path.parent),
               COLUMNS="200")  # fmt: skip
    env.pop("ENGRAM_VAULT", None)
    device.restart()  # the CLI opens the vault itself
    return subprocess.run(
        [EXE, "--vault", str(device.path), *args],
        env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        check=False,
    )  # fmt: skip


def test_history_undelete_restore_and_revert_through_the_cli(
    devices: list[DeviceHandle],
) -> None:
    alpha, bravo, _ = devices
    first = _cli(alpha, "add", "version one").stdout.strip()
    assert _cli(alpha, "edit", first, "version two").returncode == 0
    assert _cli(alpha, "delete", first).returncode == 0
    shown = _cli(alpha, "history", first)
    assert shown.returncode == 0
    lines = shown.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["v1", "v2", "v3"]
    assert "version one" in lines[0]
    assert "(edit)" in lines[0]
    assert "(delete)" in lines[1]
    assert "current" in lines[2]
    assert "(deleted)" in lines[2]
    as_json = json.loads(_cli(alpha, "history", first, "--json").stdout)
    assert [v["reason"] for v in as_json] == ["edit", "delete", None]

    undone = _cli(alpha, "undelete", first)
    assert undone.returncode == 0, undone.stderr
    assert _cli(alpha, "restore", first, "--version", "1").returncode == 0
    sync_all(alpha, bravo)
    assert contents(bravo)[first] == "version one"  # it synced like any edit

    missing = _cli(alpha, "restore", first, "--version", "99")
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1
    assert "no kept version 99" in missing.stderr
    assert "Traceback" not in missing.stderr
    not_deleted = _cli(alpha, "undelete", first)
    assert not_deleted.returncode == 1
    assert "is not deleted" in not_deleted.stderr

    # bravo's writes, taken back from alpha: a summary, a refusal without a terminal or
    # --yes, then the revert and a sync that takes it to bravo
    with bravo.open() as session:
        bravo_id = session.device.device_id
    assert _cli(bravo, "edit", first, "bravo overwrote it").returncode == 0
    sync_all(bravo, alpha)
    dry = _cli(alpha, "revert", "--device", bravo_id, "--dry-run")
    assert dry.returncode == 0
    assert "1 memories: 1 restored to an earlier version" in dry.stderr
    asks = _cli(alpha, "revert", "--device", bravo_id)
    assert asks.returncode == 1
    assert "pass --yes" in asks.stderr
    assert contents(alpha)[first] == "bravo overwrote it"  # nothing was reverted
    done = _cli(alpha, "revert", "--device", bravo_id, "--yes")
    assert done.returncode == 0, done.stderr
    assert "reverted 1 memories" in done.stdout
    sync_all(bravo)
    assert contents(bravo)[first] == "version one"
    nobody = _cli(alpha, "revert")
    assert nobody.returncode == 1
    assert "--device ID, --source SOURCE or --tool NAME" in nobody.stderr
    bad_since = _cli(alpha, "revert", "--device", bravo_id, "--since", "yesterday-ish")
    assert bad_since.returncode == 1
    assert "an age (30m, 2h, 7d)" in bad_since.stderr
    retention = _cli(alpha, "history", "--keep-days", "7")
    assert retention.returncode == 0
    assert "kept 7 days" in retention.stdout
