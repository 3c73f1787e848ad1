"""The per-user key agent (issue 17, "unlock once"; docs/agent.md).

`engram-sync unlock` derives a vault's keys once (VAULT.md §2, PROTOCOL §2) and hands them
to a detached agent process (`python -m engram_sync.client._agent`) listening on a Unix
socket, 0600 in a 0700 directory under the user's runtime directory. Every command asks it
first and falls back to the passphrase (prompt or ENGRAM_PASSPHRASE) when it has no agent,
the agent holds no keys for the vault, or the keys no longer open it. The agent keeps keys
in memory only, answers only its own uid (SO_PEERCRED), and exits after an idle timeout or
on `engram-sync lock`.

This package imports the standard library and msgspec only (no client session, no httpx):
asking the agent costs a command next to nothing.
"""
