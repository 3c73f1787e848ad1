"""One validly signed blob with a huge clock must not wedge a vault (issue 13 item 4).

Rule (docs/when-the-relay-lies.md, "Clock bound"): a verified blob whose clock is more than
2^32 above the device's clock is skipped and reported, and does not raise the clock; a
device whose clock cannot take another value says so as a sync error in `status`.
"""

from __future__ import annotations

import pytest

from engram_sync.client._http.relay_client import RelayClient
from engram_sync.client._sync.device import ClockExhaustedError
from engram_sync.client._sync.engine import CLOCK_JUMP_REASON, MAX_CLOCK_STEP
from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.wire import MAX_VECTOR_CLOCK
from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add, contents
from tests.e2e.hostile.conftest import Scene
from tests.relay.conftest import ADMIN_KEY


def _member_pushes(scene: Scene, member: DeviceHandle, memory_id: str, clock: int) -> None:
    """A member holding the vault's keys pushes a validly signed blob with `clock`."""
    with member.open() as session:
        blob = BlobCipher(session.keys).seal(
            '{"deleted":true,"id":"' + memory_id + '"}',
            vault_id=scene.vault_id,
            memory_id=memory_id,
            device_id=session.device.device_id,
            vector_clock=clock,
            deleted=True,
        )
    with RelayClient(scene.relay.url, ADMIN_KEY) as relay:
        assert relay.push(scene.vault_id, [blob]).accepted == 1


@pytest.mark.parametrize("clock", [MAX_VECTOR_CLOCK, MAX_CLOCK_STEP + 10_000])
def test_a_poisoned_clock_is_skipped_and_the_vault_keeps_syncing(scene: Scene, clock: int) -> None:
    alpha, mallory = scene.device("alpha"), scene.device("mallory")
    victim = add(alpha, "a memory mallory wants gone")
    alpha.sync()
    _member_pushes(scene, mallory, victim, clock)

    report = alpha.sync()
    assert report.invalid == 1
    with alpha.open() as session:
        assert session.device.vector_clock < 1000  # not raised
        assert [s.reason for s in session.state.skipped] == [CLOCK_JUMP_REASON]
    assert victim in contents(alpha)  # the poisoned tombstone was not applied
    later = add(alpha, "written after the poisoned blob")
    report = alpha.sync()  # every later push still works (it used to overflow)
    assert report.pushed == 1
    bravo = scene.device("bravo")
    bravo.sync()
    assert later in contents(bravo)
    with alpha.open() as session:
        assert session.state.last_error is None


def test_a_large_but_bounded_clock_is_applied_and_raises_the_clock(scene: Scene) -> None:
    """The honest counterpart: a clock well above ours but within the bound is a normal
    version (another device that wrote a lot)."""
    alpha, busy = scene.device("alpha"), scene.device("busy")
    memory = add(alpha, "a memory")
    alpha.sync()
    _member_pushes(scene, busy, memory, 1_000_000)
    report = alpha.sync()
    assert report.invalid == 0
    assert report.applied == 1
    assert memory not in contents(alpha)
    with alpha.open() as session:
        assert session.device.vector_clock >= 1_000_000


def test_an_exhausted_clock_is_a_sync_error_in_status(scene: Scene) -> None:
    alpha = scene.device("alpha")
    add(alpha, "cannot be pushed")
    with alpha.open() as session:
        session.device.vector_clock = MAX_VECTOR_CLOCK  # what an older version let happen
        session.device.save()
    with pytest.raises(ClockExhaustedError, match="2\\^63-1"):
        alpha.sync()
    with alpha.open() as session:
        assert session.state.last_error is not None
        assert "2^63-1" in session.state.last_error
