"""Fair admission of whole-vault scans (relay.domain.scan_admission; docs/digest.md "Bounded
scans"; issue 31 finding 7), the decision alone: no asyncio, no database. The gate that
executes it, against a real relay: tests/relay/services/test_scan_gate.py."""

from __future__ import annotations

import pytest

from engram_sync.relay.domain.scan_admission import (
    Refusal,
    ScanClaim,
    ScanLimits,
    ScanQueue,
    Ticket,
)


def _ticket(queue: ScanQueue, vault: str, *clients: str) -> Ticket:
    ticket = queue.offer(ScanClaim(vault, clients))
    assert isinstance(ticket, Ticket), ticket
    return ticket


def test_one_vaults_flood_holds_at_most_its_own_places() -> None:
    queue = ScanQueue(ScanLimits())  # 2 running, 8 waiting; a vault 1 and 2
    flood = [queue.offer(ScanClaim("flood", (f"key:{n}",))) for n in range(12)]
    admitted = [t for t in flood if isinstance(t, Ticket)]
    assert [t.running for t in admitted] == [True, False, False]
    assert flood[3:] == [Refusal.VAULT] * 9
    assert queue.vault_places("flood") == (1, 2)
    # another vault runs at once on the process's second place ...
    assert _ticket(queue, "victim").running
    # ... and a third vault still finds a waiting place
    assert not _ticket(queue, "third").running
    assert (queue.running, queue.waiting) == (2, 3)


def test_the_next_place_goes_round_robin_across_vaults_not_first_come() -> None:
    queue = ScanQueue(ScanLimits(running=1, waiting=8, vault_waiting=3))
    a1 = _ticket(queue, "a")
    a2, a3, a4 = (_ticket(queue, "a") for _ in range(3))
    b1, b2 = _ticket(queue, "b"), _ticket(queue, "b")
    c1 = _ticket(queue, "c")
    assert a1.running
    assert not any(t.running for t in (a2, a3, a4, b1, b2, c1))
    order = []
    running = a1
    for _ in range(6):
        (running,) = queue.finish(running)
        order.append(running)
    # a ran first, so b and c (never served) before a again; then one each in turn
    assert order == [b1, c1, a2, b2, a3, a4]
    assert queue.finish(running) == []
    assert (queue.running, queue.waiting) == (0, 0)


def test_a_vault_at_its_running_bound_is_passed_over_for_a_free_place() -> None:
    queue = ScanQueue(ScanLimits(running=2, waiting=8))
    a1, b1 = _ticket(queue, "a"), _ticket(queue, "b")
    a2 = _ticket(queue, "a")  # waits: the process has no place
    c1 = _ticket(queue, "c")
    assert (a1.running, b1.running, a2.running, c1.running) == (True, True, False, False)
    # b's place frees: a still runs a1, so c (not a2) takes it
    assert queue.finish(b1) == [c1]
    assert queue.finish(a1) == [a2]


def test_each_client_key_account_and_address_has_a_bound_across_vaults() -> None:
    queue = ScanQueue(ScanLimits(running=2, waiting=20, per_client=4))
    spread = [queue.offer(ScanClaim.of(f"v{n}", "k1", "acct", "10.0.0.1")) for n in range(6)]
    assert sum(isinstance(t, Ticket) for t in spread) == 4
    assert spread[4:] == [Refusal.CLIENT, Refusal.CLIENT]
    # the same account through another key, or the same address, is refused too
    assert queue.offer(ScanClaim.of("w", "k2", "acct", "10.0.0.2")) is Refusal.CLIENT
    assert queue.offer(ScanClaim.of("w", "k3", None, "10.0.0.1")) is Refusal.CLIENT
    # someone else is not
    assert isinstance(queue.offer(ScanClaim.of("w", "k4", "other", "10.0.0.9")), Ticket)
    # a place given back is a place again
    first = spread[0]
    assert isinstance(first, Ticket)
    queue.finish(first)
    assert isinstance(queue.offer(ScanClaim.of("v9", "k1", "acct", "10.0.0.1")), Ticket)


def test_the_process_bound_still_holds_and_a_withdrawn_waiter_frees_its_place() -> None:
    queue = ScanQueue(ScanLimits(running=1, waiting=2, vault_waiting=2))
    _ticket(queue, "a")
    w1, w2 = _ticket(queue, "b"), _ticket(queue, "c")
    assert queue.offer(ScanClaim("d")) is Refusal.PROCESS
    queue.withdraw(w1)
    assert queue.vault_places("b") == (0, 0)
    w3 = _ticket(queue, "d")
    assert not w3.running
    with pytest.raises(ValueError, match="waiting"):
        queue.withdraw(w1)
    with pytest.raises(ValueError, match="running"):
        queue.finish(w2)


def test_a_claim_names_its_clients_and_bad_limits_name_their_setting() -> None:
    claim = ScanClaim.of("v", "static:0", None, "127.0.0.1")
    assert claim.clients == ("key:static:0", "address:127.0.0.1")
    assert ScanLimits().problem() is None
    assert "ENGRAM_RELAY_SCAN_VAULT_RUNNING" in (ScanLimits(vault_running=0).problem() or "")
    assert "ENGRAM_RELAY_SCAN_VAULT_WAITING" in (ScanLimits(vault_waiting=-1).problem() or "")
    assert "ENGRAM_RELAY_SCAN_MAX_PER_CLIENT" in (ScanLimits(per_client=0).problem() or "")
