"""The vault as the MCP server uses it: opened on first use, on one thread only.

SQLCipher connections are bound to the thread that opened them, and one connection
serialises its writes anyway: every vault call of the server runs on one worker thread,
in the order the tool calls arrived, so concurrent calls from one or several clients
never interleave inside a transaction. Another process writing the same vault (a second
`engram-sync mcp`, the CLI) is serialised by SQLite's own lock (`BEGIN IMMEDIATE` with
the vault's busy timeout).

Keys come from the unlock agent (`engram-sync unlock`, docs/agent.md); ENGRAM_PASSPHRASE
works as it does for the CLI. A vault opened with the agent's keys is closed again as
soon as the agent no longer holds them (`engram-sync lock`, its idle timeout), and opened
again once it does: the server never needs a restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final, TypeVar

from .. import Vault

T = TypeVar("T")

LOCKED: Final = "the vault is locked: run `engram-sync unlock`"


class VaultUnavailableError(Exception):
    """The vault cannot be used now (locked, missing, or the passphrase does not open it)."""


class VaultAccess:
    """The vault at `path`, opened lazily on one worker thread; `run` calls a function
    with it there."""

    def __init__(self, path: Path, passphrase: str | None = None) -> None:
        self.path = path
        self._passphrase = passphrase or None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engram-vault")
        self._vault: Vault | None = None
        self._from_agent = False
        self._closed = False

    async def run(self, call: Callable[[Vault], T]) -> T:
        """`call(vault)` on the vault's thread, after every call submitted before it."""
        return await asyncio.wrap_future(self._executor.submit(self._with_vault, call))

    def run_sync(self, call: Callable[[Vault], T]) -> T:
        """The same from a thread that is not the event loop's (tests, the CLI)."""
        return self._executor.submit(self._with_vault, call).result()

    def close(self) -> None:
        """Close the vault on its thread and stop the thread (once; again does nothing)."""
        if self._closed:
            return
        self._closed = True
        self._executor.submit(self._close).result()
        self._executor.shutdown()

    def _with_vault(self, call: Callable[[Vault], T]) -> T:
        return call(self._open())

    def _open(self) -> Vault:
        if self._vault is not None and self._from_agent and not Vault.is_unlocked(self.path):
            self._close()  # locked since: the keys are gone, so is the open database
        if self._vault is not None:
            return self._vault
        if not (self.path / "engrams.db").exists():
            raise VaultUnavailableError(
                f"no vault at {self.path}: run `engram-sync init` (or set --vault DIR)"
            )
        vault = Vault.open_unlocked(self.path)
        self._from_agent = vault is not None
        if vault is None and self._passphrase is not None:
            from .. import WrongPassphraseError

            try:
                vault = Vault.open(self.path, self._passphrase)
            except WrongPassphraseError:
                raise VaultUnavailableError(
                    "ENGRAM_PASSPHRASE does not open the vault: fix it, or unset it and run"
                    " `engram-sync unlock`"
                ) from None
        if vault is None:
            raise VaultUnavailableError(LOCKED)
        self._vault = vault
        return vault

    def _close(self) -> None:
        if self._vault is not None:
            self._vault.close()
            self._vault = None
