"""What each MCP tool does, on an open `Vault`, with its arguments checked against the
limits below (docs/mcp.md "Limits"). No `mcp` import: `server` exposes these functions
and maps `ToolInputError` (and the client's own errors) to a tool error naming the
problem. The schemas the server publishes state the same limits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .. import Memory, Vault, Version, Writer

MAX_CONTENT_BYTES: Final = 64 * 1024  # UTF-8 bytes of one memory's content
MAX_QUERY_CHARS: Final = 1000
MAX_LIMIT: Final = 100
MAX_TAGS: Final = 32
MAX_TAG_CHARS: Final = 64
MAX_PROJECT_CHARS: Final = 200
MAX_ID_CHARS: Final = 100
MAX_CLIENT_NAME_CHARS: Final = 100  # history keeps 200 (client._vault.history.tool_of)
SOURCE: Final = "ai-tool"  # VAULT §3: what an MCP client writes is an AI tool's
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


class ToolInputError(ValueError):
    """An argument the tool refuses; the message names it and says why."""


@dataclass(frozen=True)
class Caller:
    """The MCP client calling, as its `initialize` named itself (clientInfo)."""

    name: str
    version: str | None = None

    @classmethod
    def of(cls, name: str | None, version: str | None) -> Caller:
        """A caller from what the client sent: control characters dropped, lengths capped;
        an unnamed client is `unknown-mcp-client`."""
        clean = _CONTROL.sub("", name or "").strip()[:MAX_CLIENT_NAME_CHARS]
        ver = _CONTROL.sub("", version or "").strip()[:MAX_CLIENT_NAME_CHARS]
        return cls(clean or "unknown-mcp-client", ver or None)

    def context(self) -> dict[str, Any]:
        """The memory context naming this client (docs/history.md: `revert --tool NAME`)."""
        return {"tool": {"name": self.name, "version": self.version}}


# -- argument checks ------------------------------------------------------------------------


def content_arg(content: str, name: str = "content") -> str:
    if not content.strip():
        raise ToolInputError(f"{name} is empty")
    size = len(content.encode("utf-8", "surrogatepass"))
    if size > MAX_CONTENT_BYTES:
        raise ToolInputError(
            f"{name} is {size} bytes; at most {MAX_CONTENT_BYTES} (64 KiB): split it into"
            " several memories"
        )
    return content


def id_arg(memory_id: str, name: str = "id") -> str:
    if not memory_id or len(memory_id) > MAX_ID_CHARS or _CONTROL.search(memory_id):
        raise ToolInputError(
            f"{name} is not a memory id (1 to {MAX_ID_CHARS} printable characters)"
        )
    return memory_id


def limit_arg(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise ToolInputError(f"limit must be between 1 and {MAX_LIMIT}")
    return limit


def tags_arg(tags: Sequence[str] | None) -> list[str]:
    found = list(tags or [])
    if len(found) > MAX_TAGS:
        raise ToolInputError(f"tags has {len(found)} entries; at most {MAX_TAGS}")
    for tag in found:
        if not tag.strip() or len(tag) > MAX_TAG_CHARS or _CONTROL.search(tag):
            raise ToolInputError(
                f"tag {tag[:MAX_TAG_CHARS]!r} is not 1 to {MAX_TAG_CHARS} printable characters"
            )
    return found


def project_arg(project: str | None) -> str | None:
    if project is None:
        return None
    if not project.strip() or len(project) > MAX_PROJECT_CHARS or _CONTROL.search(project):
        raise ToolInputError(f"project must be 1 to {MAX_PROJECT_CHARS} printable characters")
    return project


def query_arg(query: str) -> str:
    if not query.strip():
        raise ToolInputError("query is empty")
    if len(query) > MAX_QUERY_CHARS:
        raise ToolInputError(f"query is {len(query)} characters; at most {MAX_QUERY_CHARS}")
    return query


# -- answers --------------------------------------------------------------------------------


def memory_view(memory: Memory) -> dict[str, Any]:
    """A memory as the tools show it."""
    return {
        "id": memory.id,
        "content": memory.content,
        "tags": memory.tags,
        "project": memory.project,
        "layer": memory.layer,
        "scope": memory.scope,
        "privacy": memory.privacy_level,
        "source": memory.source,
        "context": memory.context,
        "created_at": memory.created_at,
        "modified_at": memory.modified_at,
        "links": [
            {"target_id": link.target_id, "link_type": link.link_type, "weight": link.weight}
            for link in memory.links
        ],
    }


def _writer_view(writer: Writer | None) -> dict[str, Any] | None:
    if writer is None:
        return None
    return {
        "device_id": writer.device_id,
        "device_label": writer.label,
        "source": writer.source,
        "tool": writer.tool,
        "at": writer.at,
    }


def _version_view(version: Version) -> dict[str, Any]:
    return {
        "version": version.version,
        "current": version.current,
        "deleted": version.deleted,
        "content": None if version.memory is None else version.memory.content,
        "tags": None if version.memory is None else version.memory.tags,
        "written_by": _writer_view(version.written),
        "replaced_at": version.replaced_at,
        "replaced_by": _writer_view(version.replaced_by),
        "reason": version.reason,
    }


def remember(
    vault: Vault,
    caller: Caller,
    content: str,
    tags: Sequence[str] | None = None,
    project: str | None = None,
    layer: str = "episodic",
    scope: str = "moment",
    privacy: str = "cloud_first",
) -> dict[str, Any]:
    memory_id = vault.add(
        content_arg(content),
        tags=tags_arg(tags),
        project=project_arg(project),
        layer=layer,  # type: ignore[arg-type]  # the schema's Literal; Vault.add checks too
        scope=scope,
        privacy_level=privacy,  # type: ignore[arg-type]
        source=SOURCE,
        context=caller.context(),
    )
    return {"id": memory_id, "privacy": privacy}


def recall(
    vault: Vault,
    query: str,
    limit: int = 10,
    tags: Sequence[str] | None = None,
    project: str | None = None,
    layer: str | None = None,
) -> dict[str, Any]:
    found = vault.search(
        query_arg(query),
        limit=limit_arg(limit),
        tags=tags_arg(tags),
        project=project_arg(project),
        layer=layer,  # type: ignore[arg-type]
    )
    return {"memories": [memory_view(m) for m in found]}


def get(vault: Vault, memory_id: str) -> dict[str, Any]:
    memory = vault.get(id_arg(memory_id))
    if memory is None:
        raise ToolInputError(_unknown(memory_id))
    return memory_view(memory)


def update(
    vault: Vault,
    caller: Caller,
    memory_id: str,
    content: str | None = None,
    privacy: str | None = None,
    tags: Sequence[str] | None = None,
    project: str | None = None,
    layer: str | None = None,
) -> dict[str, Any]:
    """A new version with what is given changed (tags replace all the memory's tags)."""
    if all(v is None for v in (content, privacy, tags, project, layer)):
        raise ToolInputError(
            "nothing to change: give content, privacy, tags, project or layer (or several)"
        )
    changed = vault.edit(
        id_arg(memory_id),
        None if content is None else content_arg(content),
        privacy_level=privacy,  # type: ignore[arg-type]  # the schema's Literal; edit checks
        tags=None if tags is None else tags_arg(tags),
        project=project_arg(project),
        layer=layer,  # type: ignore[arg-type]
        source=SOURCE,
        tool=caller.name,
    )
    if not changed:
        raise ToolInputError(_unknown(memory_id))
    return {"id": memory_id, "updated": True}


def forget(vault: Vault, caller: Caller, memory_id: str) -> dict[str, Any]:
    if not vault.delete(id_arg(memory_id), source=SOURCE, tool=caller.name):
        raise ToolInputError(_unknown(memory_id))
    return {"id": memory_id, "forgotten": True, "undo": "undelete(id)"}


def list_recent(vault: Vault, limit: int = 20, project: str | None = None) -> dict[str, Any]:
    found = vault.recent(limit_arg(limit), project=project_arg(project))
    return {"memories": [memory_view(m) for m in found]}


def link(
    vault: Vault,
    caller: Caller,
    source_id: str,
    target_id: str,
    link_type: str = "associative",
) -> dict[str, Any]:
    linked = vault.link_memories(
        id_arg(source_id, "source_id"),
        id_arg(target_id, "target_id"),
        link_type,  # type: ignore[arg-type]
        source=SOURCE,
        tool=caller.name,
    )
    if not linked:
        missing = source_id if vault.get(source_id) is None else target_id
        raise ToolInputError(_unknown(missing))
    return {"source_id": source_id, "target_id": target_id, "link_type": link_type}


def sync_status(vault: Vault, live: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Where the vault stands, with the live loop's view (`LiveView.as_dict`) when given."""
    status = vault.status()
    shown = dict(live or {"live": False, "live_state": "off"})
    if status.relay is None:
        note = "not linked to a relay: memories stay on this device"
    elif shown.get("live_state") == "offline":
        note = "the relay cannot be reached: writes are kept here and pushed once it is back"
    elif shown.get("live"):
        note = "synced live: writes reach the other devices within seconds"
    else:
        note = "this server does not sync now: run `engram-sync sync` or `engram-sync watch`"
    return {
        "linked": status.relay is not None,
        "relay": status.relay,
        "vault_id": status.vault_id,
        "last_sync_at": status.last_sync_at,
        "pending_pushes": status.pending_pushes,
        "pending_deletions": status.pending_tombstones,
        "local_only": status.local_only,
        **shown,
        "note": note,
    }


def history(vault: Vault, memory_id: str, limit: int = 20) -> dict[str, Any]:
    versions = vault.history(id_arg(memory_id))
    if not versions:
        raise ToolInputError(_unknown(memory_id))
    shown = versions[-limit_arg(limit) :]
    return {
        "id": memory_id,
        "versions": [_version_view(v) for v in shown],
        "omitted_older": len(versions) - len(shown),
    }


def undelete(vault: Vault, caller: Caller, memory_id: str) -> dict[str, Any]:
    vault.undelete(id_arg(memory_id), source=SOURCE, tool=caller.name)
    return {"id": memory_id, "undeleted": True}


def project_memories(vault: Vault, project: str) -> dict[str, Any]:
    """The `engram://project/{name}` resource: its newest memories."""
    found = vault.recent(MAX_LIMIT, project=project_arg(project))
    return {"project": project, "memories": [memory_view(m) for m in found]}


def _unknown(memory_id: str) -> str:
    return f"no memory {memory_id[:MAX_ID_CHARS]!r}: recall or list_recent gives the ids"
