"""Who may run or wait for a whole-vault scan, and who runs next (PROTOCOL §18; docs/digest.md
"Bounded scans"): the decision of relay.services.scan_gate, as values, without asyncio or a
database.

A scan is claimed by its vault and its clients (the key, the key's account, the client
address). A claim is admitted only while every bound has room:

- the process: at most `running` run and `waiting` more wait (ENGRAM_RELAY_SCAN_MAX_RUNNING,
  ENGRAM_RELAY_SCAN_MAX_WAITING);
- its vault: at most `vault_running` run and `vault_waiting` more wait
  (ENGRAM_RELAY_SCAN_VAULT_RUNNING, ENGRAM_RELAY_SCAN_VAULT_WAITING): one vault's flood of
  requests can never fill the process's places (issue 31: a flood of 12 narrowings of one
  vault took the places and 37 of another vault's 40 bucket digests were refused);
- each of its clients: at most `per_client` places, running or waiting
  (ENGRAM_RELAY_SCAN_MAX_PER_CLIENT): one key, account or address spreading its flood over
  many vaults is bounded too.

When a scan ends, the waiters are served round robin across vaults, never first come first
served: the next place goes to the first waiter of the vault served least recently (a
vault whose scan just started or ran goes behind every vault still waiting for its turn),
so a vault with waiters gets a free place after at most one scan of each other vault that
waits.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

DEFAULT_VAULT_RUNNING: Final = 1
DEFAULT_VAULT_WAITING: Final = 2
DEFAULT_PER_CLIENT: Final = 4
ENV_VAULT_RUNNING: Final = "ENGRAM_RELAY_SCAN_VAULT_RUNNING"
ENV_VAULT_WAITING: Final = "ENGRAM_RELAY_SCAN_VAULT_WAITING"
ENV_PER_CLIENT: Final = "ENGRAM_RELAY_SCAN_MAX_PER_CLIENT"


@dataclass(frozen=True)
class ScanLimits:
    """The bounds of one process's scans (defaults: 2 running, 8 waiting, a vault 1 and
    2, a client 4 places)."""

    running: int = 2
    waiting: int = 8
    vault_running: int = DEFAULT_VAULT_RUNNING
    vault_waiting: int = DEFAULT_VAULT_WAITING
    per_client: int = DEFAULT_PER_CLIENT

    def problem(self) -> str | None:
        """What is wrong with these bounds (naming the setting), or None."""
        if self.running < 1:
            return "ENGRAM_RELAY_SCAN_MAX_RUNNING must be >= 1"
        if self.waiting < 0:
            return "ENGRAM_RELAY_SCAN_MAX_WAITING must be >= 0"
        if self.vault_running < 1:
            return f"{ENV_VAULT_RUNNING} must be >= 1"
        if self.vault_waiting < 0:
            return f"{ENV_VAULT_WAITING} must be >= 0"
        if self.per_client < 1:
            return f"{ENV_PER_CLIENT} must be >= 1"
        return None


@dataclass(frozen=True)
class ScanClaim:
    """One request's claim: its vault and its clients (`key:…`, `account:…`, `address:…`)."""

    vault_id: str
    clients: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, vault_id: str, key_id: str | None, account_id: str | None, address: str | None
    ) -> ScanClaim:
        """The claim of a request by key `key_id` of `account_id` from `address`."""
        named = (("key", key_id), ("account", account_id), ("address", address))
        return cls(vault_id, tuple(f"{kind}:{value}" for kind, value in named if value))


class Refusal(Enum):
    """Which bound refused a claim."""

    PROCESS = "process"
    VAULT = "vault"
    CLIENT = "client"


@dataclass(eq=False)
class Ticket:
    """An admitted claim: waiting until `running`, then running until finished."""

    claim: ScanClaim
    running: bool = False


@dataclass
class ScanQueue:
    """The places of one process's scans and its waiters, round robin across vaults."""

    limits: ScanLimits
    running: int = 0
    waiting: int = 0
    _vault_running: Counter[str] = field(default_factory=Counter)
    _vault_waiting: dict[str, deque[Ticket]] = field(default_factory=dict)
    _client_places: Counter[str] = field(default_factory=Counter)
    # when each vault with a scan running or waiting was last let run (a tick of `_ticks`)
    _served: dict[str, int] = field(default_factory=dict)
    _ticks: int = 0

    def offer(self, claim: ScanClaim) -> Ticket | Refusal:
        """A ticket (running at once, or waiting) or the bound that refuses the claim."""
        limits, vault = self.limits, claim.vault_id
        if any(self._client_places[c] >= limits.per_client for c in claim.clients):
            return Refusal.CLIENT
        ticket = Ticket(claim)
        queued = self._vault_waiting.get(vault)
        if self.running < limits.running and self._vault_running[vault] < limits.vault_running:
            # a free place: every waiter, if any, is of a vault at its own running bound
            self._start(ticket)
        elif (len(queued) if queued else 0) >= limits.vault_waiting:
            return Refusal.VAULT
        elif self.waiting >= limits.waiting:
            return Refusal.PROCESS
        else:
            if queued is None:
                queued = self._vault_waiting[vault] = deque()
            queued.append(ticket)
            self.waiting += 1
        for client in claim.clients:
            self._client_places[client] += 1
        return ticket

    def finish(self, ticket: Ticket) -> list[Ticket]:
        """`ticket`'s scan ended: its places are free; the waiters that run now."""
        if not ticket.running:
            raise ValueError("only a running scan finishes")
        ticket.running = False
        vault = ticket.claim.vault_id
        self.running -= 1
        self._vault_running[vault] -= 1
        if not self._vault_running[vault]:
            del self._vault_running[vault]
        self._free_clients(ticket)
        self._forget_if_idle(vault)
        return self._promote()

    def withdraw(self, ticket: Ticket) -> None:
        """A waiting `ticket` gave up (its time bound passed, or its request went away)."""
        vault = ticket.claim.vault_id
        queued = self._vault_waiting.get(vault)
        if ticket.running or queued is None or ticket not in queued:
            raise ValueError("only a waiting scan withdraws")
        queued.remove(ticket)
        self.waiting -= 1
        if not queued:
            del self._vault_waiting[vault]
        self._free_clients(ticket)
        self._forget_if_idle(vault)

    def _free_clients(self, ticket: Ticket) -> None:
        for client in ticket.claim.clients:
            self._client_places[client] -= 1
            if not self._client_places[client]:
                del self._client_places[client]

    def _forget_if_idle(self, vault: str) -> None:
        if vault not in self._vault_running and vault not in self._vault_waiting:
            self._served.pop(vault, None)

    def _start(self, ticket: Ticket) -> None:
        vault = ticket.claim.vault_id
        ticket.running = True
        self.running += 1
        self._vault_running[vault] += 1
        self._ticks += 1
        self._served[vault] = self._ticks

    def _promote(self) -> list[Ticket]:
        """Waiters into the free running places, the vault served least recently first
        (a vault never served yet, or not since it was idle, before any other; ties in the
        order their vaults began to wait)."""
        started: list[Ticket] = []
        while self.running < self.limits.running:
            ready = [
                v for v in self._vault_waiting if self._vault_running[v] < self.limits.vault_running
            ]
            if not ready:
                break
            vault = min(ready, key=lambda v: self._served.get(v, 0))
            queued = self._vault_waiting[vault]
            ticket = queued.popleft()
            if not queued:
                del self._vault_waiting[vault]
            self.waiting -= 1
            self._start(ticket)
            started.append(ticket)
        return started

    def vault_places(self, vault_id: str) -> tuple[int, int]:
        """(running, waiting) of `vault_id` now."""
        queued = self._vault_waiting.get(vault_id)
        return self._vault_running[vault_id], len(queued) if queued else 0
