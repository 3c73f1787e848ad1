"""Live sync inside `engram-sync mcp` (issue 33, docs/mcp.md "Live sync"): two devices,
each with its own server over stdio (a subprocess, the real `mcp` client) and live sync on,
through one real relay. What an AI tool remembers on one is recalled on the other, and
what it forgets there is gone here, without anyone calling `sync`; with the relay stopped
mid-way the tools keep working, `sync_status` says offline, and once the relay is back the
write reaches the other device."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp_types import Implementation

from engram_sync.client._flows import live as live_flow
from engram_sync.client._mcp.access import VaultAccess
from engram_sync.client._mcp.live import LiveLoop
from engram_sync.client._mcp.server import build_server
from engram_sync.relay.services.config import RelayConfig
from tests.e2e.conftest import PASSPHRASE, DeviceHandle, make_device
from tests.relay.conftest import Relay, RelayThread, base_config

EXE = str(Path(sys.executable).parent / "engram-sync")
DEADLINE_S = 90.0  # a bound for a change to cross on 2 shared cores, not a timing


def start_relay(config: RelayConfig, port: int | None = None) -> RelayThread:
    """The relay in a thread; on `port` when given (a restart keeps the devices' URL)."""
    server = RelayThread(config)
    if port is not None:
        server.port, server.url = port, f"http://127.0.0.1:{port}"
        server.server.config.port = port
    return server.start()


@asynccontextmanager
async def server_on(device: DeviceHandle, *extra: str) -> AsyncIterator[Client]:
    home = device.path.parent / "home"
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"),
           "XDG_RUNTIME_DIR": str(home / "run"),  # no agent there: ENGRAM_PASSPHRASE opens it
           "ENGRAM_PASSPHRASE": PASSPHRASE}  # fmt: skip
    args = ["--vault", str(device.path), "mcp", *extra]
    params = StdioServerParameters(command=EXE, args=args, env=env)
    info = Implementation(name=f"claude-on-{device.name}", version="1")
    async with Client(params, client_info=info, read_timeout_seconds=60) as client:
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)  # type: ignore[union-attr]


async def until(what: str, probe: Callable[[], Awaitable[bool]]) -> float:
    """Poll `probe` until true (DEADLINE_S at most); the seconds it took."""
    start = time.monotonic()
    while not await probe():
        assert time.monotonic() - start < DEADLINE_S, f"{what}: not within {DEADLINE_S}s"
        await anyio.sleep(0.05)
    return time.monotonic() - start


async def recalled(client: Client, query: str, memory_id: str) -> bool:
    found = await call(client, "recall", query=query)
    return memory_id in [m["id"] for m in found["memories"]]


async def gone(client: Client, memory_id: str) -> bool:
    return bool((await client.call_tool("get", {"id": memory_id})).is_error)


async def live_state(client: Client) -> str:
    return str((await call(client, "sync_status"))["live_state"])


Setup = tuple[RelayConfig, RelayThread, DeviceHandle, DeviceHandle]


def two_devices(tmp_path: Path, fresh_database_url: str) -> Setup:
    config = base_config(fresh_database_url)
    server = start_relay(config)
    relay = Relay(server.url, fresh_database_url, config)
    alpha, bravo = (make_device(tmp_path, relay, name) for name in ("alpha", "bravo"))
    return config, server, alpha, bravo


def test_remembered_on_one_device_is_recalled_on_the_other_without_a_sync_call(
    tmp_path: Path, fresh_database_url: str
) -> None:
    _, server, alpha, bravo = two_devices(tmp_path, fresh_database_url)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            on_a = await stack.enter_async_context(server_on(alpha))
            on_b = await stack.enter_async_context(server_on(bravo))
            for client in (on_a, on_b):
                await until("live", lambda c=client: _is(live_state(c), "connected"))
            memory_id = (await call(on_a, "remember", content="Standups moved to 9:30"))["id"]
            await until("recall on B", lambda: recalled(on_b, "standups", memory_id))
            found = await call(on_b, "get", id=memory_id)
            assert found["context"] == {"tool": {"name": "claude-on-alpha", "version": "1"}}
            await call(on_b, "forget", id=memory_id)
            await until("forget on A", lambda: gone(on_a, memory_id))
            status = await call(on_a, "sync_status")
            assert (status["linked"], status["live"], status["live_mode"]) == (True, True, "events")
            assert status["live_last_sync_at"] is not None

    try:
        anyio.run(main)
    finally:
        server.stop()


def test_relay_down_mid_way_tools_keep_working_and_the_write_crosses_once_it_is_back(
    tmp_path: Path, fresh_database_url: str
) -> None:
    config, server, alpha, bravo = two_devices(tmp_path, fresh_database_url)
    servers = [server]

    async def main() -> None:
        async with AsyncExitStack() as stack:
            on_a = await stack.enter_async_context(server_on(alpha))
            on_b = await stack.enter_async_context(server_on(bravo))
            first = (await call(on_a, "remember", content="before the outage"))["id"]
            await until("first on B", lambda: recalled(on_b, "outage", first))
            await anyio.to_thread.run_sync(servers[0].stop)
            during = await call(on_a, "remember", content="written while the relay is down")
            assert await recalled(on_a, "relay down", during["id"])  # the tools work locally
            await until("offline on A", lambda: _is(live_state(on_a), "offline"))
            status = await call(on_a, "sync_status")
            assert status["pending_pushes"] >= 1
            assert "cannot be reached" in status["note"]
            assert not await recalled(on_b, "relay down", during["id"])
            port = servers[0].port
            servers.append(await anyio.to_thread.run_sync(lambda: start_relay(config, port)))
            await until("the outage write on B", lambda: recalled(on_b, "relay down", during["id"]))
            await until("A back live", lambda: _is(live_state(on_a), "connected"))
            assert (await call(on_a, "sync_status"))["pending_pushes"] == 0

    try:
        anyio.run(main)
    finally:
        servers[-1].stop()


NUDGED_WITHIN_S = 10.0  # far below the minute the loop's own check waits here


def test_a_tool_write_wakes_the_live_loop_without_waiting_for_its_check(
    tmp_path: Path, fresh_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's look at the vault for local writes is set to a minute (and its timer is
    the default five): only the tools' nudge after `remember` explains a push within
    seconds."""
    monkeypatch.setattr(live_flow, "LiveTiming", _slow_local_check(live_flow.LiveTiming))
    _, server, alpha, _ = two_devices(tmp_path, fresh_database_url)
    access = VaultAccess(alpha.path, PASSPHRASE)
    loop = LiveLoop(alpha.path, PASSPHRASE).start()

    async def main() -> None:
        async with Client(build_server(access, loop)) as client:
            await until("live", lambda: _is(live_state(client), "connected"))
            assert (await call(client, "sync_status"))["pending_pushes"] == 0
            await anyio.sleep(1.0)  # past the loop's gap between two syncs (0.5 s)
            await call(client, "remember", content="pushed at once, not at the next check")
            start = time.monotonic()
            while (await call(client, "sync_status"))["pending_pushes"]:
                waited = time.monotonic() - start
                assert waited < NUDGED_WITHIN_S, "the write waited for the loop's own check"
                await anyio.sleep(0.05)

    try:
        anyio.run(main)
    finally:
        loop.stop()
        access.close()
        server.stop()


def _slow_local_check(timing: type[live_flow.LiveTiming]) -> Callable[[], live_flow.LiveTiming]:
    return lambda: timing(local_check_s=60.0)


async def _is(state: Awaitable[str], wanted: str) -> bool:
    return await state == wanted
