"""Small helpers shared by the e2e tests."""

from __future__ import annotations

import os
import pty
import subprocess
from collections.abc import Mapping

from engram_sync.client._vault import store as local_store
from tests.e2e.conftest import DeviceHandle
from tests.terminal import read_until_closed


def contents(device: DeviceHandle) -> dict[str, str]:
    """memory id -> content of every memory on a device."""
    with device.open() as session:
        return {m.id: m.content for m in local_store.list_memories(session.vault.conn)}


def add(device: DeviceHandle, text: str, **kwargs: object) -> str:
    with device.open() as session, session.vault.transaction() as conn:
        return local_store.add_memory(conn, text, **kwargs)  # type: ignore[arg-type]


def edit(device: DeviceHandle, memory_id: str, text: str) -> None:
    with device.open() as session, session.vault.transaction() as conn:
        assert local_store.edit_memory(conn, memory_id, text)


def delete(device: DeviceHandle, memory_id: str) -> None:
    with device.open() as session, session.vault.transaction() as conn:
        assert local_store.delete_memory(conn, memory_id)


def conflicts(device: DeviceHandle) -> list[tuple[str, str]]:
    """(memory id, kept local plaintext) of every conflict on a device."""
    with device.open() as session:
        rows = session.vault.conn.execute(
            "SELECT memory_id, local_plaintext FROM sync_conflicts ORDER BY id"
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def sync_all(*devices: DeviceHandle, rounds: int = 2) -> None:
    for _ in range(rounds):
        for device in devices:
            device.sync()


def stderr_on_a_terminal(
    args: list[str], env: Mapping[str, str]
) -> tuple[subprocess.CompletedProcess[str], bytes]:
    """Run `args` with stderr on a pseudo-terminal (what a person sees) and stdout a pipe:
    the finished process (its stdout captured) and every byte the terminal received."""
    master, replica = pty.openpty()
    with subprocess.Popen(
        args, env=dict(env), stdout=subprocess.PIPE, stderr=replica, text=True
    ) as proc:
        os.close(replica)
        seen = read_until_closed(master)
        stdout = proc.stdout.read() if proc.stdout else ""
    os.close(master)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, ""), seen
