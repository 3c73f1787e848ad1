"""`engram-sync mcp`'s tools and resources (issue 33, docs/mcp.md), driven by the real `mcp`
client in-process against a real SQLCipher vault: every tool's honest case, arguments the
server refuses (each naming the problem, the server serving on), provenance, concurrent
calls from two clients on the vault's one thread, and `revert --tool` taking back what a
client wrote. The stdio subprocess, the unlock agent and the relay: test_mcp_stdio.py and
tests/e2e/test_mcp_two_devices.py."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_types import Implementation

from engram_sync.client import Vault
from engram_sync.client._mcp.access import VaultAccess
from engram_sync.client._mcp.server import build_server

PASSPHRASE = "mcp tools correct horse battery staple"
TOOLS = {
    "remember", "recall", "get", "update", "forget", "list_recent", "link", "sync_status",
    "history", "undelete",
}  # fmt: skip


@pytest.fixture
def access(tmp_path: Path) -> Any:
    Vault.open(tmp_path / "vault", PASSPHRASE, create=True).close()
    found = VaultAccess(tmp_path / "vault", PASSPHRASE)
    yield found
    found.close()


def drive(
    access: VaultAccess,
    script: Callable[[Client], Awaitable[Any]],
    name: str = "claude-code",
    version: str = "2.1.0",
) -> Any:
    """Run `script(client)` with an in-process client named `name` on a server over `access`."""
    server = build_server(access)

    async def main() -> Any:
        info = Implementation(name=name, version=version)
        async with Client(server, client_info=info) as client:
            return await script(client)

    return anyio.run(main)


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    """The tool's JSON answer; fails the test on a tool error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)  # type: ignore[union-attr]


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    """The text of the tool error the call gets."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.content
    return str(result.content[0].text)  # type: ignore[union-attr]


def test_every_tool_and_resource_answers_its_honest_case(access: VaultAccess) -> None:
    async def script(client: Client) -> None:
        listed = await client.list_tools()
        assert {t.name for t in listed.tools} == TOOLS
        for tool in listed.tools:  # a schema and a one-line description for every tool
            assert tool.description
            assert "\n" not in tool.description
            assert tool.input_schema["type"] == "object"
        first = (await call(client, "remember", content="Deploy with make ship", tags=["ops"],
                            project="infra", layer="semantic", scope="rule"))["id"]  # fmt: skip
        second = (await call(client, "remember", content="The staging box is flaky"))["id"]
        found = await call(client, "recall", query="deploy ship", limit=5)
        assert [m["id"] for m in found["memories"]] == [first]
        assert (await call(client, "recall", query="deploy", project="elsewhere"))["memories"] == []
        memory = await call(client, "get", id=first)
        assert (memory["content"], memory["tags"], memory["project"]) == (
            "Deploy with make ship", ["ops"], "infra")  # fmt: skip
        assert (memory["layer"], memory["scope"], memory["source"]) == (
            "semantic",
            "rule",
            "ai-tool",
        )
        await call(client, "update", id=first, content="Deploy with make release")
        assert (await call(client, "get", id=first))["content"] == "Deploy with make release"
        await call(client, "link", source_id=second, target_id=first, link_type="causal")
        assert (await call(client, "get", id=second))["links"] == [
            {"target_id": first, "link_type": "causal", "weight": 0.5}]  # fmt: skip
        recent = await call(client, "list_recent", limit=1)
        assert [m["id"] for m in recent["memories"]] == [second]  # the link edited it last
        infra = await call(client, "list_recent", project="infra")
        assert [m["id"] for m in infra["memories"]] == [first]
        await call(client, "forget", id=first)
        assert "no memory" in await refused(client, "get", id=first)
        await call(client, "undelete", id=first)
        kept = await call(client, "history", id=first)
        assert [v["content"] for v in kept["versions"]] == [
            "Deploy with make ship", "Deploy with make release", None, "Deploy with make release"
        ]  # fmt: skip
        assert kept["versions"][1]["replaced_by"]["tool"] == "claude-code"
        status = await call(client, "sync_status")
        assert (status["linked"], status["live"], status["pending_pushes"]) == (False, False, 2)
        read = await client.read_resource(f"engram://memory/{first}")
        assert json.loads(read.contents[0].text)["id"] == first  # type: ignore[union-attr]
        read = await client.read_resource("engram://project/infra")
        shown = json.loads(read.contents[0].text)  # type: ignore[union-attr]
        assert [m["id"] for m in shown["memories"]] == [first]

    drive(access, script)


def test_bad_arguments_name_the_problem_and_the_server_keeps_serving(
    access: VaultAccess,
) -> None:
    async def script(client: Client) -> None:
        known = (await call(client, "remember", content="a memory to point at"))["id"]
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("remember", {"content": 5}, "content"),
            ("remember", {"content": ""}, "content"),
            ("remember", {"content": "x" * 70_000}, "content"),
            # 30,000 characters pass the schema's length; 90,000 UTF-8 bytes do not pass ours
            ("remember", {"content": "€" * 30_000}, "64 KiB"),
            ("remember", {"content": "ok", "tags": [f"t{i}" for i in range(40)]}, "tags"),
            ("remember", {"content": "ok", "tags": ["x" * 100]}, "tags"),
            ("remember", {"content": "ok", "privacy": "public"}, "privacy"),
            ("remember", {"content": "ok", "layer": "dream"}, "layer"),
            ("recall", {"query": "x", "limit": 1000}, "limit"),
            ("recall", {"query": ["deploy"]}, "query"),
            ("recall", {"query": "q" * 2000}, "query"),
            ("list_recent", {"limit": 0}, "limit"),
            ("get", {"id": "mem_nope"}, "no memory 'mem_nope'"),
            ("get", {"id": "x" * 500}, "id"),
            ("get", {}, "id"),
            ("update", {"id": known}, "nothing to change"),
            ("update", {"id": "mem_nope", "content": "new"}, "no memory 'mem_nope'"),
            ("forget", {"id": "mem_nope"}, "no memory 'mem_nope'"),
            ("link", {"source_id": known, "target_id": "mem_nope"}, "no memory 'mem_nope'"),
            ("link", {"source_id": known, "target_id": known}, "itself"),
            ("link", {"source_id": known, "target_id": known, "link_type": "x"}, "link_type"),
            ("history", {"id": "mem_nope"}, "no memory 'mem_nope'"),
            ("undelete", {"id": known}, "not deleted"),
        ]
        for tool, arguments, named in cases:
            message = await refused(client, tool, **arguments)
            assert named in message, (tool, arguments, message)
        unknown = await client.call_tool("drop_everything", {})
        assert unknown.is_error
        # still serving, and nothing refused was written
        assert (await call(client, "get", id=known))["content"] == "a memory to point at"
        assert len((await call(client, "list_recent", limit=100))["memories"]) == 1

    drive(access, script)


def test_update_changes_tags_project_and_layer_as_one_version(access: VaultAccess) -> None:
    async def script(client: Client) -> None:
        first = (await call(client, "remember", content="Backups run nightly at two",
                            tags=["ops", "old"], project="infra"))["id"]  # fmt: skip
        await call(client, "update", id=first, tags=["ops", "backup"], project="platform",
                   layer="semantic")  # fmt: skip
        memory = await call(client, "get", id=first)
        assert (memory["tags"], memory["project"], memory["layer"], memory["content"]) == (
            ["ops", "backup"], "platform", "semantic", "Backups run nightly at two")  # fmt: skip
        found = await call(client, "recall", query="backups", tags=["backup"],
                           project="platform", layer="semantic")  # fmt: skip
        assert [m["id"] for m in found["memories"]] == [first]
        assert (await call(client, "recall", query="backups", project="infra"))["memories"] == []
        # one new version for the three changes; the same values again make none
        await call(client, "update", id=first, tags=["ops", "backup"], layer="semantic")
        kept = await call(client, "history", id=first)
        assert [v["tags"] for v in kept["versions"]] == [["ops", "old"], ["ops", "backup"]]
        assert kept["versions"][0]["replaced_by"]["tool"] == "claude-code"
        await call(client, "update", id=first, tags=[])  # [] removes every tag
        assert (await call(client, "get", id=first))["tags"] == []
        for arguments, named in [
            ({"id": first, "layer": "dream"}, "layer"),
            ({"id": first, "tags": ["x" * 100]}, "tags"),
            ({"id": first, "tags": [f"t{i}" for i in range(40)]}, "tags"),
            ({"id": first, "tags": ["bad\ttag"]}, "tag"),
            ({"id": first, "project": ""}, "project"),
            ({"id": first, "project": "p" * 300}, "project"),
            ({"id": first, "project": "a\x00b"}, "project"),
            ({"id": "mem_nope", "layer": "semantic"}, "no memory 'mem_nope'"),
        ]:
            message = await refused(client, "update", **arguments)
            assert named in message, (arguments, message)
        memory = await call(client, "get", id=first)  # nothing refused was written
        assert (memory["tags"], memory["project"], memory["layer"]) == ([], "platform", "semantic")

    drive(access, script)


def test_a_missing_vault_or_a_wrong_passphrase_is_one_clear_error(tmp_path: Path) -> None:
    missing = VaultAccess(tmp_path / "nowhere", PASSPHRASE)
    try:
        message = drive(missing, lambda c: refused(c, "sync_status"))
        assert f"no vault at {tmp_path / 'nowhere'}" in message
    finally:
        missing.close()
    Vault.open(tmp_path / "vault", PASSPHRASE, create=True).close()
    wrong = VaultAccess(tmp_path / "vault", "not the passphrase")
    try:
        message = drive(wrong, lambda c: refused(c, "recall", query="x"))
        assert "ENGRAM_PASSPHRASE does not open the vault" in message
    finally:
        wrong.close()


def test_remember_names_the_client_in_the_context_and_revert_tool_takes_it_back(
    access: VaultAccess, tmp_path: Path
) -> None:
    with Vault.open(tmp_path / "vault", PASSPHRASE) as vault:
        mine = vault.add("the person's own memory")

    async def script(client: Client) -> list[str]:
        written = [(await call(client, "remember", content=f"tool note {i}"))["id"]
                   for i in range(3)]  # fmt: skip
        await call(client, "update", id=mine, content="rewritten by the tool")
        await call(client, "forget", id=written[0])
        return written

    written = drive(access, script, name="cursor-agent", version="0.9")
    other = drive(access, lambda c: call(c, "remember", content="another tool's note"),
                  name="codex")  # fmt: skip
    access.close()  # the vault's thread ends; the checks below open the vault themselves
    with Vault.open(tmp_path / "vault", PASSPHRASE) as vault:
        memory = vault.get(written[1])
        assert memory is not None
        assert memory.source == "ai-tool"
        assert memory.context == {"tool": {"name": "cursor-agent", "version": "0.9"}}
        plan = vault.revert(tool="cursor-agent")
        assert not plan.unrevertible
        remaining = {m.id: m.content for m in vault.list()}
    # the tool's memories are gone, the person's is back, the other tool's stays
    assert remaining == {mine: "the person's own memory", other["id"]: "another tool's note"}


def test_eight_concurrent_remembers_from_two_clients_land_once_each(
    access: VaultAccess,
) -> None:
    server = build_server(access)

    async def one_client(name: str, results: list[str]) -> None:
        info = Implementation(name=name, version="1")
        async with Client(server, client_info=info) as client, anyio.create_task_group() as group:
            for i in range(4):

                async def remember(i: int = i) -> None:
                    answer = await call(client, "remember", content=f"{name} memory {i}")
                    results.append(answer["id"])

                group.start_soon(remember)

    async def main() -> list[str]:
        results: list[str] = []
        async with anyio.create_task_group() as group:
            group.start_soon(one_client, "claude-code", results)
            group.start_soon(one_client, "cursor", results)
        return results

    ids = anyio.run(main)
    contents = access.run_sync(lambda v: sorted(m.content for m in v.list()))
    assert len(ids) == len(set(ids)) == 8
    assert contents == sorted(
        f"{n} memory {i}" for n in ("claude-code", "cursor") for i in range(4)
    )


def test_strict_local_is_kept_local_by_the_vault(access: VaultAccess) -> None:
    async def script(client: Client) -> Any:
        kept = await call(client, "remember", content="my bank PIN hint", privacy="strict_local")
        return kept, await call(client, "sync_status")

    kept, status = drive(access, script)
    assert kept["privacy"] == "strict_local"
    assert (status["local_only"], status["pending_pushes"]) == (1, 0)  # nothing to push


def test_a_client_name_is_cleaned_and_capped_and_revert_source_takes_every_tool_back(
    access: VaultAccess, tmp_path: Path
) -> None:
    """clientInfo is the client's word: a label, not an identity. Control characters go,
    100 characters stay; whatever names the clients give, `revert(source="ai-tool")` takes
    back everything written through MCP."""
    with Vault.open(tmp_path / "vault", PASSPHRASE) as vault:
        mine = vault.add("the person's own memory")
    noisy = "evil\x1b[31m\n\x00tool" + "x" * 500
    first = drive(access, lambda c: call(c, "remember", content="one"), name=noisy,
                  version="1\r\n2")  # fmt: skip
    drive(access, lambda c: call(c, "forget", id=mine), name="")
    memory = access.run_sync(lambda v: v.get(first["id"]))
    assert memory is not None
    name = memory.context["tool"]["name"]
    assert name == ("evil[31mtool" + "x" * 500)[:100]
    assert memory.context["tool"]["version"] == "12"
    unnamed = access.run_sync(lambda v: v.history(mine)[-1].written)
    assert (unnamed.source, unnamed.tool) == ("ai-tool", "unknown-mcp-client")
    access.run_sync(lambda v: v.revert(source="ai-tool"))
    assert access.run_sync(lambda v: [m.content for m in v.list()]) == ["the person's own memory"]
