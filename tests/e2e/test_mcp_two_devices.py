"""Two devices, each with its own `engram-sync mcp` over stdio, through a real relay (issue
33): what an AI tool remembers on one is recalled by an AI tool on the other after both
sync, a `forget` there removes it here, a strict_local memory never leaves its device, and
`sync_status` tells where each stands. The servers run with `--no-live` and sync by hand,
so every step is deterministic (live sync: test_mcp_live.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp_types import Implementation

from tests.e2e.conftest import PASSPHRASE, DeviceHandle

EXE = str(Path(sys.executable).parent / "engram-sync")


def over_stdio(device: DeviceHandle, script: Callable[[Client], Awaitable[Any]]) -> Any:
    home = device.path.parent / "home"
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"),
           "XDG_RUNTIME_DIR": str(home / "run"),  # no agent there: ENGRAM_PASSPHRASE opens it
           "ENGRAM_PASSPHRASE": PASSPHRASE}  # fmt: skip
    args = ["--vault", str(device.path), "mcp", "--no-live"]  # synced by hand here
    params = StdioServerParameters(command=EXE, args=args, env=env)

    async def main() -> Any:
        info = Implementation(name=f"claude-on-{device.name}", version="1")
        async with Client(params, client_info=info, read_timeout_seconds=60) as client:
            return await script(client)

    return anyio.run(main)


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)  # type: ignore[union-attr]


def test_remembered_on_one_device_recalled_on_the_other_and_forgotten_back(
    devices: list[DeviceHandle],
) -> None:
    alpha, bravo, _ = devices

    async def on_alpha(client: Client) -> tuple[str, str]:
        shared = await call(client, "remember", content="The release train leaves on Tuesdays",
                            tags=["process"])  # fmt: skip
        private = await call(client, "remember", content="Tuesday locker code hint",
                             privacy="strict_local")  # fmt: skip
        status = await call(client, "sync_status")
        assert (status["linked"], status["pending_pushes"], status["local_only"]) == (True, 1, 1)
        return shared["id"], private["id"]

    shared, private = over_stdio(alpha, on_alpha)
    alpha.sync()
    bravo.sync()

    async def on_bravo(client: Client) -> None:
        found = await call(client, "recall", query="release train tuesdays")
        assert [(m["id"], m["content"]) for m in found["memories"]] == [
            (shared, "The release train leaves on Tuesdays")]  # fmt: skip
        assert found["memories"][0]["context"] == {"tool": {"name": "claude-on-alpha",
                                                            "version": "1"}}  # fmt: skip
        assert (await call(client, "recall", query="locker"))["memories"] == []
        status = await call(client, "sync_status")
        assert status["last_sync_at"] is not None
        assert status["pending_pushes"] == 0
        await call(client, "forget", id=shared)

    over_stdio(bravo, on_bravo)
    bravo.sync()
    alpha.sync()

    async def on_alpha_again(client: Client) -> None:
        missing = await client.call_tool("get", {"id": shared})
        assert missing.is_error
        assert "no memory" in missing.content[0].text  # type: ignore[union-attr]
        kept = await call(client, "get", id=private)  # the strict_local one is still here
        assert kept["privacy"] == "strict_local"

    over_stdio(alpha, on_alpha_again)
