"""`engram-sync mcp` as an AI client starts it: a subprocess speaking MCP over stdio, driven
by the real `mcp` client (issue 33, docs/mcp.md). Keys from the real unlock agent: a locked
vault is one clear error on every tool, `engram-sync unlock` while the server runs is picked
up without a restart, `engram-sync lock` is followed too. Two server processes on one vault
take 8 concurrent writes; the CLI shows and reverts what a client wrote; `--print-config`
prints a snippet without any passphrase."""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp_types import Implementation

from engram_sync.client._agent import control
from tests.client.agent.test_agent import EXE, PASSPHRASE, Env, new_vault, ok, user
from tests.relay.conftest import ADMIN_KEY, Relay

__all__ = ["user"]  # the fixture, shared with test_agent.py

LOCKED = "the vault is locked: run `engram-sync unlock`"


def idle_left() -> float:
    """Seconds until the agent's idle timeout (the test process asks the same agent)."""
    reply = control.status()
    assert reply is not None
    assert reply.idle_left_s is not None
    return reply.idle_left_s


def server_params(env: Env, vault: Path, passphrase: str | None = None) -> StdioServerParameters:
    extra = {"HOME": str(env.home), "XDG_CONFIG_HOME": str(env.home / "config"),
             "XDG_RUNTIME_DIR": str(env.runtime)}  # fmt: skip
    if passphrase is not None:
        extra["ENGRAM_PASSPHRASE"] = passphrase
    return StdioServerParameters(command=EXE, args=["--vault", str(vault), "mcp"], env=extra)


def over_stdio(params: StdioServerParameters, script: Callable[[Client], Awaitable[Any]],
               name: str = "claude-code") -> Any:  # fmt: skip
    async def main() -> Any:
        info = Implementation(name=name, version="2.1.0")
        async with Client(params, client_info=info, read_timeout_seconds=60) as client:
            return await script(client)

    return anyio.run(main)


async def answer(client: Client, tool: str, **arguments: Any) -> tuple[bool, str]:
    result = await client.call_tool(tool, arguments)
    return bool(result.is_error), str(result.content[0].text)  # type: ignore[union-attr]


def test_a_locked_vault_then_unlock_and_lock_while_the_server_runs(user: Env) -> None:
    vault = new_vault(user)

    async def script(client: Client) -> str:
        for tool, arguments in [("remember", {"content": "too early"}), ("sync_status", {}),
                                ("recall", {"query": "x"}), ("get", {"id": "mem_x"})]:  # fmt: skip
            failed, text = await answer(client, tool, **arguments)
            assert failed, (tool, text)
            assert LOCKED in text, (tool, text)
        await anyio.to_thread.run_sync(lambda: ok(user.cli("unlock", passphrase=PASSPHRASE,
                                                           vault=vault)))  # fmt: skip
        failed, text = await answer(client, "remember", content="after unlock")
        assert not failed, text
        memory_id: str = json.loads(text)["id"]
        # each tool call is a use of the keys: it restarts the agent's idle clock
        await anyio.sleep(1.0)
        before = idle_left()
        failed, text = await answer(client, "recall", query="unlock")
        assert not failed, text
        assert idle_left() > before + 0.5
        await anyio.to_thread.run_sync(lambda: ok(user.cli("lock", vault=vault)))
        failed, text = await answer(client, "get", id=memory_id)
        assert failed
        assert LOCKED in text, text
        await anyio.to_thread.run_sync(lambda: ok(user.cli("unlock", passphrase=PASSPHRASE,
                                                           vault=vault)))  # fmt: skip
        failed, text = await answer(client, "get", id=memory_id)
        assert not failed, text
        assert "after unlock" in text, text
        return memory_id

    memory_id = over_stdio(server_params(user, vault), script)
    # the CLI (through the agent) shows which client wrote it; nothing was written locked
    shown = json.loads(ok(user.cli("show", memory_id, vault=vault)))
    assert shown["source"] == "ai-tool"
    assert shown["context"] == {"tool": {"name": "claude-code", "version": "2.1.0"}}
    listed = json.loads(ok(user.cli("list", "--json", vault=vault)))
    assert [m["content"] for m in listed] == ["after unlock"]


def test_two_server_processes_take_eight_concurrent_writes_and_revert_tool_undoes_one(
    user: Env,
) -> None:
    vault = new_vault(user)
    mine = ok(user.cli("add", "the person's memory", passphrase=PASSPHRASE, vault=vault)).strip()
    ids: list[str] = []

    async def client(name: str) -> None:
        async def script(c: Client) -> None:
            async with anyio.create_task_group() as group:
                for i in range(4):

                    async def remember(i: int = i) -> None:
                        failed, text = await answer(c, "remember", content=f"{name} note {i}")
                        assert not failed, text
                        ids.append(json.loads(text)["id"])

                    group.start_soon(remember)
            if name == "cursor":
                failed, text = await answer(c, "update", id=mine, content="cursor rewrote it")
                assert not failed, text

        info = Implementation(name=name, version="1")
        params = server_params(user, vault, PASSPHRASE)  # ENGRAM_PASSPHRASE works as the CLI's
        async with Client(params, client_info=info, read_timeout_seconds=60) as c:
            await script(c)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(client, "claude-code")
            group.start_soon(client, "cursor")

    anyio.run(main)
    listed = json.loads(ok(user.cli("list", "--json", passphrase=PASSPHRASE, vault=vault)))
    notes = sorted(m["content"] for m in listed if m["id"] != mine)
    assert len(ids) == len(set(ids)) == 8
    assert notes == sorted(f"{n} note {i}" for n in ("claude-code", "cursor") for i in range(4))
    ok(user.cli("revert", "--tool", "cursor", "--yes", passphrase=PASSPHRASE, vault=vault))
    listed = json.loads(ok(user.cli("list", "--json", passphrase=PASSPHRASE, vault=vault)))
    assert sorted(m["content"] for m in listed) == sorted(
        ["the person's memory", *(f"claude-code note {i}" for i in range(4))]
    )


def test_print_config_for_each_client_has_the_command_and_no_passphrase(user: Env) -> None:
    vault = new_vault(user)
    parsed: dict[str, Any] = {}
    for client in ("claude", "cursor", "codex", "vscode"):
        done = user.cli("mcp", "--print-config", client, passphrase=PASSPHRASE, vault=vault)
        text = ok(done)
        assert PASSPHRASE not in text
        assert "PASSPHRASE" not in text
        parsed[client] = tomllib.loads(text) if client == "codex" else json.loads(text)
    servers = [
        parsed["claude"]["mcpServers"]["engram"],
        parsed["cursor"]["mcpServers"]["engram"],
        parsed["codex"]["mcp_servers"]["engram"],
        parsed["vscode"]["servers"]["engram"],
    ]
    for server in servers:
        assert Path(server["command"]).is_absolute()
        assert Path(server["command"]).exists()
        assert server["args"] == ["mcp"]
        assert server["env"] == {"ENGRAM_VAULT": str(vault.resolve())}
    assert parsed["vscode"]["servers"]["engram"]["type"] == "stdio"
    refused = user.cli("mcp", "--print-config", "notepad", vault=vault)
    assert refused.returncode == 1
    assert "one of claude, cursor, codex, vscode" in refused.stderr


def open_vault_files(vault: Path) -> int:
    """How many file descriptors of `engram-sync mcp` processes on `vault` point at its
    engrams.db (the tools' connection and the live loop's each hold it open)."""
    database = str((vault / "engrams.db").resolve())
    count = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"mcp" not in argv or str(vault).encode() not in argv:
                continue
            count += sum(1 for fd in (proc / "fd").iterdir() if os.readlink(fd) == database)
        except OSError:
            continue  # a process that ended meanwhile
    return count


def test_the_live_loop_waits_for_unlock_follows_lock_and_never_uses_the_keys(
    user: Env, relay: Relay
) -> None:
    """Live sync on (the default), the vault linked to a real relay: locked, the loop opens
    nothing; after `unlock` it opens its own connection and goes live; its once-a-second
    checks are not uses of the keys (the agent's idle clock runs down); after `lock` it
    closes its connection, as the tools close theirs at their next call."""
    vault = new_vault(user)
    ok(user.cli("link", "--relay", relay.url, "--api-key", ADMIN_KEY, "--vault-id", "mcp-live",
                passphrase=PASSPHRASE, vault=vault))  # fmt: skip

    async def files_until(what: str, check: Callable[[int], bool]) -> None:
        for _ in range(300):
            if check(open_vault_files(vault)):
                return
            await anyio.sleep(0.05)
        raise AssertionError(f"{what}: {open_vault_files(vault)} open")

    async def script(client: Client) -> None:
        failed, text = await answer(client, "sync_status")
        assert failed
        assert LOCKED in text
        await anyio.sleep(1.5)
        assert open_vault_files(vault) == 0  # the loop waits: nothing opened while locked
        await anyio.to_thread.run_sync(lambda: ok(user.cli("unlock", passphrase=PASSPHRASE,
                                                           vault=vault)))  # fmt: skip
        await files_until("the loop's own connection", lambda n: n > 0)  # before any tool call
        for _ in range(300):
            failed, text = await answer(client, "sync_status")
            assert not failed, text
            if json.loads(text)["live_state"] == "connected":
                break
            await anyio.sleep(0.1)
        status = json.loads(text)
        assert (status["linked"], status["live"], status["live_state"]) == (
            True, True, "connected")  # fmt: skip
        before = idle_left()
        await anyio.sleep(3.0)  # no tool call: only the loop runs, asking the agent's status
        assert idle_left() < before - 2.5
        await anyio.to_thread.run_sync(lambda: ok(user.cli("lock", vault=vault)))
        failed, text = await answer(client, "recall", query="anything")
        assert failed
        assert LOCKED in text
        await files_until("every connection closed after lock", lambda n: n == 0)

    over_stdio(server_params(user, vault), script)
