"""`engram-sync mcp --print-config CLIENT`: the snippet each AI client's MCP settings need
to start `engram-sync mcp` (docs/mcp.md "Setup"). No passphrase, ever: the server takes
its keys from the unlock agent."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Final

CLIENTS: Final = ("claude", "cursor", "codex", "vscode")

#: Where each client reads its MCP servers from (printed on stderr, above the snippet).
WHERE: Final = {
    "claude": "Claude Desktop: claude_desktop_config.json (Settings > Developer > Edit Config);"
    " Claude Code: .mcp.json in a project, or `claude mcp add-json engram '<the inner object>'`",
    "cursor": "Cursor: ~/.cursor/mcp.json (or .cursor/mcp.json in a project)",
    "codex": "Codex: ~/.codex/config.toml",
    "vscode": "VS Code: .vscode/mcp.json in the workspace (or the user mcp.json)",
}


def engram_sync_command() -> str:
    """The `engram-sync` to start: the one running now when it is the entry point (an AI
    client's PATH rarely has the virtual environment), else the one on PATH."""
    running = Path(sys.argv[0])
    if running.name == "engram-sync" and running.exists():
        return str(running.resolve())
    return shutil.which("engram-sync") or "engram-sync"


def snippet(client: str, vault_dir: Path, command: str) -> str:
    """The configuration text for `client` (one of CLIENTS)."""
    env = {"ENGRAM_VAULT": str(vault_dir)}
    args = ["mcp"]
    if client in ("claude", "cursor"):
        server = {"command": command, "args": args, "env": env}
        return json.dumps({"mcpServers": {"engram": server}}, indent=2)
    if client == "vscode":
        server = {"type": "stdio", "command": command, "args": args, "env": env}
        return json.dumps({"servers": {"engram": server}}, indent=2)
    if client == "codex":
        return "\n".join(
            [
                "[mcp_servers.engram]",
                f"command = {json.dumps(command)}",
                f"args = {json.dumps(args)}",
                f"env = {{ ENGRAM_VAULT = {json.dumps(str(vault_dir))} }}",
            ]
        )
    raise ValueError(f"unknown client {client!r}: one of {', '.join(CLIENTS)}")
