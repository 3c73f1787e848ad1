"""`engram-sync mcp --http` as a process, driven by the real `mcp` client over Streamable
HTTP (issue 33, docs/mcp.md "HTTP"): a client with its token works and is named by it when
it sends no name; no token, a wrong token and a revoked token are refused with 401 before
any tool runs; a host other than 127.0.0.1 is refused in one line; the token file is 0600
and holds no token. The vault is not linked: the tools work locally and `sync_status` says
so."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import Implementation

from engram_sync.client._mcp.tokens import TOKENS_FILE
from tests.client.agent.test_agent import EXE, PASSPHRASE, WAIT_S, Env, new_vault, ok, user
from tests.relay.conftest import free_port

__all__ = ["user"]  # the fixture, shared with test_agent.py

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "intruder", "version": "1"}},
}  # fmt: skip
REMEMBER = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "remember", "arguments": {"content": "written without a token"}},
}


@contextmanager
def http_server(user: Env, vault: Path, *extra: str) -> Iterator[str]:
    """`engram-sync mcp --http` on a free port; its URL once it listens."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(HOME=str(user.home), XDG_CONFIG_HOME=str(user.home / "config"),
               XDG_RUNTIME_DIR=str(user.runtime), ENGRAM_PASSPHRASE=PASSPHRASE)  # fmt: skip
    args = [EXE, "--vault", str(vault), "mcp", "--http", "--port", str(port), *extra]
    process = subprocess.Popen(
        args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            assert process.poll() is None, process.communicate()[1]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not listen"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(WAIT_S)
        assert process.stderr is not None
        process.stderr.close()


def over_http(url: str, token: str | None, script: Callable[[Client], Awaitable[Any]],
              name: str = "cursor") -> Any:  # fmt: skip
    async def main() -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else None
        async with create_mcp_http_client(headers=headers) as http:
            transport = streamable_http_client(url, http_client=http)
            info = Implementation(name=name, version="3.1")
            async with Client(transport, client_info=info, read_timeout_seconds=60) as client:
                return await script(client)

    return anyio.run(main)


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)  # type: ignore[union-attr]


def refused_by_the_client(url: str, token: str | None,
                          script: Callable[[Client], Awaitable[Any]]) -> None:  # fmt: skip
    """The real client's first request is refused (401): it raises MCPError, maybe inside
    the task group's exception group."""
    try:
        over_http(url, token, script)
    except MCPError:
        return
    except BaseExceptionGroup as group:
        refused, _ = group.split(MCPError)
        assert refused is not None, group
        return
    raise AssertionError("the client was served")


def raw_post(url: str, body: dict[str, Any], token: str | None, **extra: str) -> httpx.Response:
    headers = {"Accept": "application/json, text/event-stream", **extra}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(url, json=body, headers=headers, timeout=30)


def add_token(user: Env, vault: Path, name: str) -> str:
    return ok(user.cli("mcp", "token", "add", name, vault=vault)).strip()


def test_a_token_per_client_and_every_other_request_refused_before_any_tool(user: Env) -> None:
    vault = new_vault(user)
    cursor = add_token(user, vault, "cursor-laptop")
    gone = add_token(user, vault, "old-agent")
    path = vault / TOKENS_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = path.read_text()
    assert cursor not in stored  # only hashes
    assert gone not in stored
    listed = ok(user.cli("mcp", "token", "list", vault=vault))
    assert [line.split()[0] for line in listed.splitlines()] == ["cursor-laptop", "old-agent"]
    assert cursor not in listed

    with http_server(user, vault) as url:

        async def works(client: Client) -> str:
            written = await call(client, "remember", content="HTTP tokens are per client")
            memory_id: str = written["id"]
            found = await call(client, "recall", query="tokens per client")
            assert [m["id"] for m in found["memories"]] == [memory_id]
            assert found["memories"][0]["context"] == {"tool": {"name": "cursor", "version": "3.1"}}
            status = await call(client, "sync_status")
            assert (status["linked"], status["live"]) == (False, False)
            assert "not linked" in status["note"]
            return memory_id

        over_http(url, cursor, works)

        async def unnamed(client: Client) -> None:  # no clientInfo name: the token's name
            memory_id = (await call(client, "remember", content="from a nameless client"))["id"]
            memory = await call(client, "get", id=memory_id)
            assert memory["context"]["tool"]["name"] == "old-agent"

        over_http(url, gone, unnamed, name="")

        wrong = cursor[:-4] + ("AAAA" if not cursor.endswith("AAAA") else "BBBB")
        for token in (None, wrong, "not-even-a-token", "engram_mcp_" + "x" * 43):
            for body in (INITIALIZE, REMEMBER):
                refused = raw_post(url, body, token)
                assert refused.status_code == 401, (token, refused.text)
        refused_by_the_client(url, wrong, works)  # the real client cannot even initialize
        refused_by_the_client(url, None, works)

        ok(user.cli("mcp", "token", "revoke", "old-agent", vault=vault))  # while it runs
        assert raw_post(url, INITIALIZE, gone).status_code == 401
        refused_by_the_client(url, gone, unnamed)
        assert raw_post(url, INITIALIZE, cursor).status_code == 200  # the other still works
        # a session answers only the token that opened it (the package's principal check)
        session = raw_post(url, INITIALIZE, cursor).headers["mcp-session-id"]
        codex = add_token(user, vault, "codex")
        taken = raw_post(url, REMEMBER, codex, **{"mcp-session-id": session})
        assert taken.status_code == 404, taken.text
        # a page that rebinds a name to 127.0.0.1, even holding a token: the package's
        # Host and Origin checks refuse it
        port = url.split(":")[2].split("/")[0]
        rebound = raw_post(url, INITIALIZE, cursor, Host=f"evil.example:{port}")
        assert rebound.status_code == 421, rebound.text
        foreign = raw_post(url, INITIALIZE, cursor, Origin="http://evil.example")
        assert foreign.status_code == 403, foreign.text

        async def contents(client: Client) -> list[str]:
            recent = await call(client, "list_recent", limit=100)
            return sorted(m["content"] for m in recent["memories"])

        assert over_http(url, cursor, contents) == [
            "HTTP tokens are per client", "from a nameless client"]  # fmt: skip
    listed = ok(user.cli("mcp", "token", "list", vault=vault))
    assert [line.split()[0] for line in listed.splitlines()] == ["codex", "cursor-laptop"]


def test_http_on_any_host_but_loopback_is_refused_in_one_line(user: Env) -> None:
    vault = new_vault(user)
    add_token(user, vault, "cursor")
    for host in ("0.0.0.0", "192.168.1.10", "localhost"):
        refused = user.cli("mcp", "--http", "--host", host, vault=vault)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert "127.0.0.1 only" in refused.stderr
    no_tokens = new_vault(user, "bare")
    refused = user.cli("mcp", "--http", vault=no_tokens)
    assert refused.returncode == 1
    assert "engram-sync mcp token add NAME" in refused.stderr
