"""The MCP server: `tools` behind the `mcp` package's `MCPServer`, over stdio or over
Streamable HTTP on 127.0.0.1 with a bearer token per client (`http`), with the live sync
loop (`live`) beside it unless `--no-live`.

Imported only by `engram-sync mcp` and the tests (the `mcp` extra). Each tool's schema
comes from its annotated parameters (pydantic), with the limits of `tools`; arguments the
schema refuses, and every `ToolInputError` or error of the client, come back as a tool
error naming the problem, and the server keeps serving.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from pydantic import Field

from engram_sync import __version__

from .. import HistoryError, SyncError, Vault, VaultError
from . import tools
from .access import VaultAccess, VaultUnavailableError
from .live import OFF, LiveLoop, LiveView
from .tools import (
    MAX_CONTENT_BYTES,
    MAX_ID_CHARS,
    MAX_LIMIT,
    MAX_PROJECT_CHARS,
    MAX_QUERY_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    Caller,
)

T = TypeVar("T")

INSTRUCTIONS = (
    "Engram is the user's long-term memory, end-to-end encrypted and synced across their"
    " devices. `recall` before answering questions about the user, their projects or past"
    " decisions; `remember` durable facts, preferences and decisions (one idea per memory);"
    " `update` or `forget` memories that are wrong. Everything you write is marked as yours"
    " and the user can take it back."
)

#: What the tools may be refused for: shown to the model as the tool error's text.
_REFUSED = (ValueError, VaultUnavailableError, HistoryError, SyncError, VaultError)

MemoryId = Annotated[
    str, Field(min_length=1, max_length=MAX_ID_CHARS, description="A memory id (from recall).")
]
Content = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_CONTENT_BYTES,
        description=f"The memory's text, at most {MAX_CONTENT_BYTES} UTF-8 bytes.",
    ),
]
Tags = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=MAX_TAG_CHARS)]] | None,
    Field(max_length=MAX_TAGS, description=f"At most {MAX_TAGS} tags, each short."),
]
Project = Annotated[
    str | None,
    Field(min_length=1, max_length=MAX_PROJECT_CHARS, description="A project name."),
]
Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT, description=f"1 to {MAX_LIMIT}.")]
LayerArg = Literal["episodic", "semantic", "imagined"]
ScopeArg = Literal["moment", "episode", "narrative", "rule"]
Privacy = Literal["strict_local", "hybrid", "cloud_first", "enterprise"]
LinkTypeArg = Literal["associative", "causal", "analogical", "temporal"]


def token_name_of(ctx: Context[Any, Any]) -> str | None:
    """The name of the bearer token the HTTP request came with (None over stdio)."""
    request = getattr(ctx.request_context, "request", None)
    scope = getattr(request, "scope", None)
    user = scope.get("user") if isinstance(scope, dict) else None
    token = getattr(user, "access_token", None)
    name = getattr(token, "client_id", None)
    return name if isinstance(name, str) else None


def caller_of(ctx: Context[Any, Any]) -> Caller:
    """The client as its `initialize` named itself (clientInfo name and version); over
    HTTP, a client that sends no name is named by its token."""
    params = getattr(ctx.session, "client_params", None)
    info = getattr(params, "client_info", None)
    name = getattr(info, "name", None)
    if not (name or "").strip():
        name = token_name_of(ctx)
    return Caller.of(name, getattr(info, "version", None))


# long: every tool and resource is declared inside, each a few lines bound to this server's
#   vault access and caller; their checks and work are in client._mcp.tools
def build_server(access: VaultAccess, live: LiveLoop | None = None, **auth: Any) -> MCPServer:
    """The MCP server over the vault `access` opens, `live` its sync loop (None: none);
    `auth` is the `token_verifier` and `auth` settings of `http` (none over stdio)."""
    server: MCPServer = MCPServer(
        "engram-sync",
        version=__version__,
        instructions=INSTRUCTIONS,
        log_level="WARNING",
        **auth,
    )

    async def call(answer: Callable[[Vault], T]) -> T:
        try:
            return await access.run(answer)
        except _REFUSED as exc:
            raise ToolError(str(exc)) from None

    async def write(answer: Callable[[Vault], T]) -> T:
        """`call` for a tool that writes: once committed, the live loop pushes it now."""
        done = await call(answer)
        if live is not None:
            live.nudge()
        return done

    @server.tool(description="Save a memory (one fact, preference or decision); returns its id.")
    async def remember(
        content: Content,
        ctx: Context[Any, Any],
        tags: Tags = None,
        project: Project = None,
        layer: LayerArg = "episodic",
        scope: ScopeArg = "moment",
        privacy: Annotated[
            Privacy,
            Field(description="strict_local: never leaves this device; default cloud_first."),
        ] = "cloud_first",
    ) -> dict[str, Any]:
        caller = caller_of(ctx)
        return await write(
            lambda v: tools.remember(v, caller, content, tags, project, layer, scope, privacy)
        )

    @server.tool(description="Search memories by words, most relevant first.")
    async def recall(
        query: Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS)],
        limit: Limit = 10,
        tags: Tags = None,
        project: Project = None,
        layer: LayerArg | None = None,
    ) -> dict[str, Any]:
        return await call(lambda v: tools.recall(v, query, limit, tags, project, layer))

    @server.tool(description="Read one memory in full by its id.")
    async def get(id: MemoryId) -> dict[str, Any]:
        return await call(lambda v: tools.get(v, id))

    @server.tool(
        description="Change a memory: its content, privacy, tags (all replaced), project or layer."
    )
    async def update(
        id: MemoryId,
        ctx: Context[Any, Any],
        content: Content | None = None,
        privacy: Privacy | None = None,
        tags: Annotated[
            list[Annotated[str, Field(min_length=1, max_length=MAX_TAG_CHARS)]] | None,
            Field(max_length=MAX_TAGS, description="The new tags, replacing all; [] removes."),
        ] = None,
        project: Project = None,
        layer: LayerArg | None = None,
    ) -> dict[str, Any]:
        caller = caller_of(ctx)
        return await write(
            lambda v: tools.update(v, caller, id, content, privacy, tags, project, layer)
        )

    @server.tool(description="Delete a memory everywhere it syncs (undelete brings it back).")
    async def forget(id: MemoryId, ctx: Context[Any, Any]) -> dict[str, Any]:
        caller = caller_of(ctx)
        return await write(lambda v: tools.forget(v, caller, id))

    @server.tool(description="The most recently changed memories, newest first.")
    async def list_recent(limit: Limit = 20, project: Project = None) -> dict[str, Any]:
        return await call(lambda v: tools.list_recent(v, limit, project))

    @server.tool(description="Link one memory to another (associative, causal, ...).")
    async def link(
        source_id: MemoryId,
        target_id: MemoryId,
        ctx: Context[Any, Any],
        link_type: LinkTypeArg = "associative",
    ) -> dict[str, Any]:
        caller = caller_of(ctx)
        return await write(lambda v: tools.link(v, caller, source_id, target_id, link_type))

    @server.tool(description="Whether the vault syncs: relay, last sync, pending pushes.")
    async def sync_status() -> dict[str, Any]:
        view = (live.view() if live is not None else LiveView(OFF)).as_dict()
        return await call(lambda v: tools.sync_status(v, view))

    @server.tool(description="Earlier versions of a memory kept on this device, oldest first.")
    async def history(id: MemoryId, limit: Limit = 20) -> dict[str, Any]:
        return await call(lambda v: tools.history(v, id, limit))

    @server.tool(description="Bring a forgotten (deleted) memory back.")
    async def undelete(id: MemoryId, ctx: Context[Any, Any]) -> dict[str, Any]:
        caller = caller_of(ctx)
        return await write(lambda v: tools.undelete(v, caller, id))

    async def read(answer: Callable[[Vault], T]) -> T:
        try:
            return await access.run(answer)
        except _REFUSED as exc:
            raise ResourceError(str(exc)) from None

    @server.resource(
        "engram://memory/{memory_id}", mime_type="application/json", description="One memory."
    )
    async def memory_resource(memory_id: str) -> dict[str, Any]:
        return await read(lambda v: tools.get(v, memory_id))

    @server.resource(
        "engram://project/{name}",
        mime_type="application/json",
        description=f"A project's {MAX_LIMIT} most recently changed memories.",
    )
    async def project_resource(name: str) -> dict[str, Any]:
        return await read(lambda v: tools.project_memories(v, name))

    return server


def run_stdio(vault_dir: Path, passphrase: str | None, *, live: bool = True) -> None:
    """Serve the vault over stdio until the client closes it, syncing live unless `live`
    is false."""
    access = VaultAccess(vault_dir, passphrase)
    loop = LiveLoop(vault_dir, passphrase, enabled=live).start()
    try:
        build_server(access, loop).run("stdio")
    finally:
        loop.stop()
        access.close()
