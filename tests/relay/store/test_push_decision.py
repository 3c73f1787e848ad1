"""relay.store.push's `PushDecision` without a database: a push group decided push by push
(PROTOCOL §6 steps 2-7 and the quota), each push on what the ones before it left. The SQL
around it (reads under the vault locks, the writes) is tested against PostgreSQL in
tests/relay/services/test_push_groups.py and tests/relay/http/test_concurrency.py."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec
import pytest

from engram_sync.relay.domain.domain_errors import QuotaExceededError, VaultRetiredError
from engram_sync.relay.domain.push_rules import StoredVersion, check_structure
from engram_sync.relay.store.push import LockedVault, PushDecision, PushJob, Quota
from engram_sync.shared_format import SyncBlob
from tests.relay.support import Sealer

VAULT = "vault-decision"
SEALER = Sealer(VAULT)
DEV = SEALER.device_id


def blob(memory: str, clock: int = 1, **changes: Any) -> SyncBlob:
    return msgspec.structs.replace(SEALER.blob(memory, clock), **changes)


def job(*blobs: SyncBlob, bound: str | None = None) -> PushJob:
    return PushJob(VAULT, check_structure(list(blobs), 1000), bound)


def vault(seq: int = 10, quota: Quota | None = None, **fields: Any) -> LockedVault:
    return LockedVault(VAULT, seq, 0, 0, 0, quota or Quota(0, 0), **fields)


def known(memory: str, clock: int, size: int, *, owner: str = DEV) -> dict[str, Any]:
    """A row of `_READ_KNOWN`: a memory's stored version."""
    return {"vault_id": VAULT, "revoked": False, "id": memory, "clock": clock, "size": size,
            "owner": owner, "deleted": False}  # fmt: skip


def revoked_row(device: str) -> dict[str, Any]:
    """A row of `_READ_KNOWN`: a revoked device among the pushers."""
    return {"vault_id": VAULT, "revoked": True, "id": device, "clock": 0, "size": 0,
            "owner": device, "deleted": False}  # fmt: skip


def decide(decision: PushDecision, push: PushJob) -> tuple[list[str], list[str], int]:
    """As `_decide` runs it, with the devices (if asked for) already read: accepted and
    rejected memories, and the cursor answered."""
    stored = decision.stored_versions(push)
    plan = decision.plan(push, stored)
    if not plan.accepted:
        return [], plan.rejected, decision.vaults[VAULT].seq
    new_bytes = decision.projected_bytes(push, plan, stored)
    outcome = decision.accept(push, plan, new_bytes)
    return [c.blob.memory_id for c in plan.accepted], plan.rejected, outcome.cursor


def test_the_rows_read_become_stored_versions_and_revoked_devices() -> None:
    decision = PushDecision.read(
        {VAULT: vault()}, [known("a", 3, 40), revoked_row("gone")], max_blob_bytes=1 << 20
    )
    assert decision.revoked == {(VAULT, "gone")}
    assert decision.stored_versions(job(blob("a", 4), blob("b"))) == {"a": StoredVersion(3, 40)}
    assert decision.writes == {}


def test_a_later_push_of_the_group_is_judged_on_what_the_earlier_one_left() -> None:
    decision = PushDecision.read({VAULT: vault(seq=10)}, [], max_blob_bytes=1 << 20)
    assert decide(decision, job(blob("m", 5), blob("n", 1))) == (["m", "n"], [], 12)
    # the same memory at a lower clock is now stale; a higher one replaces the held write
    assert decide(decision, job(blob("m", 4))) == ([], ["m"], 12)
    assert decide(decision, job(blob("m", 6))) == (["m"], [], 13)
    held = {memory: (w.item.blob.vector_clock, w.seq) for (_, memory), w in decision.writes.items()}
    assert held == {"m": (6, 13), "n": (1, 12)}
    counts = decision.vaults[VAULT]
    assert (counts.live_blobs, counts.tombstones) == (2, 0)  # m replaced, not added twice
    assert decide(decision, job(blob("n", 2, deleted=True))) == (["n"], [], 14)
    assert (counts.live_blobs, counts.tombstones) == (1, 1)


def test_a_revoked_device_is_refused_and_a_retired_vault_refuses_every_push() -> None:
    decision = PushDecision.read({VAULT: vault()}, [revoked_row("gone")], max_blob_bytes=1 << 20)
    assert decide(decision, job(blob("a", device_id="gone"), blob("b"))) == (["b"], ["a"], 11)
    retired = VaultRetiredError(VAULT, "successor-vault")
    decision = PushDecision.read({VAULT: vault(retired=retired)}, [], max_blob_bytes=1 << 20)
    with pytest.raises(VaultRetiredError) as refused:
        decide(decision, job(blob("a")))
    assert refused.value.successor == "successor-vault"
    assert decision.writes == {}


def test_the_byte_quota_refuses_growth_only() -> None:
    big = blob("a")
    size = check_structure([big], 1)[0].size_bytes
    decision = PushDecision.read(
        {VAULT: vault(quota=Quota(0, size + 5))}, [], max_blob_bytes=1 << 20
    )
    assert decide(decision, job(big))[0] == ["a"]
    with pytest.raises(QuotaExceededError) as over:
        decide(decision, job(blob("b")))
    assert (over.value.detail, over.value.limit) == ("bytes", size + 5)
    assert decision.vaults[VAULT].seq == 11  # the refused push took no sequence number
    assert decide(decision, job(blob("a", 2)))[0] == ["a"]  # a replacement of equal size


def test_the_device_quota_is_counted_once_read_and_refuses_a_new_device_only() -> None:
    decision = PushDecision.read(
        {VAULT: vault(quota=Quota(1, 0))}, [known("a", 1, 10)], max_blob_bytes=1 << 20
    )
    push = job(blob("a", 2))
    assert decision.needs_active_devices(push)
    decision.vaults[VAULT].active_devices = Counter({DEV: 1})  # what `_decide` reads
    assert not decision.needs_active_devices(push)
    assert decide(decision, push)[0] == ["a"]
    with pytest.raises(QuotaExceededError) as over:
        decide(decision, job(blob("b", device_id="second-device")))
    assert (over.value.detail, over.value.limit, over.value.used) == ("devices", 1, 2)
    # a vault already over a lowered limit keeps syncing its devices
    decision.vaults[VAULT].active_devices = Counter({DEV: 1, "second-device": 1})
    assert decide(decision, job(blob("c", device_id="second-device")))[0] == ["c"]


def test_the_projection_refuses_to_guess_the_devices_it_was_not_given() -> None:
    decision = PushDecision.read({VAULT: vault(quota=Quota(1, 0))}, [], max_blob_bytes=1 << 20)
    push = job(blob("a"))
    plan = decision.plan(push, {})
    with pytest.raises(RuntimeError, match="active devices"):
        decision.projected_bytes(push, plan, {})


def test_accept_replaces_what_the_earlier_push_accepted_without_being_asked_first() -> None:
    """Issue 36: accepted versions become stored versions only when a later push needs them
    (`unstored`); `accept` itself finds them too, not only `stored_versions`, so the digest's
    fold is given the version each blob replaced and the counts do not take it twice."""
    decision = PushDecision.read({VAULT: vault(seq=10)}, [], max_blob_bytes=1 << 20)
    for push in (job(blob("m", 1)), job(blob("m", 2))):
        decision.accept(push, decision.plan(push, {}), 0)
    counts = decision.vaults[VAULT]
    assert (counts.seq, counts.live_blobs) == (12, 1)
    first, second = counts.versions
    assert first[1] is None
    assert second[1] is not None
    assert second[1].version.vector_clock == 1
