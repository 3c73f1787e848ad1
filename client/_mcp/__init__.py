"""`engram-sync mcp`: the vault's memories as MCP tools and resources for AI clients
(issue 33, docs/mcp.md).

A thin layer over the public `engram_sync.client` API: `access` owns the one thread the
vault is used on and how it is opened (the unlock agent's keys, or ENGRAM_PASSPHRASE),
`tools` checks each tool's arguments and answers it, `server` puts them behind the `mcp`
package's `MCPServer` (imported only here: the `mcp` extra), and `client_config` prints
the snippet each AI client needs. Nothing here imports relay code.
"""
