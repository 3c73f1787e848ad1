"""When a push answer proves that nothing else was committed between the device's cursor
and its own commit (PROTOCOL §9), the cursor moves past its own blobs; any other answer
leaves the cursor for the next pull (issue 15; client._sync.own_pushes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engram_sync.client._sync.own_pushes import OwnSkip, own_commit_end, refuted_start
from engram_sync.client._sync.state import MAX_OWN_SKIPS, SyncState
from engram_sync.shared_format.wire import PushResponse, SyncBlob

SENT = ["m1", "m2", "m3"]


def answer(**fields: Any) -> PushResponse:
    values: dict[str, Any] = {"accepted": 3, "cursor": 13}
    values.update(fields)
    return PushResponse(**values)


def test_only_our_own_commit_since_the_cursor_moves_it() -> None:
    assert own_commit_end(answer(), cursor=10, sent=SENT) == 13
    # one rejected: two sequence numbers are ours
    assert (
        own_commit_end(answer(accepted=2, rejected=["m2"], cursor=12), cursor=10, sent=SENT) == 12
    )


@pytest.mark.parametrize(
    ("why", "response"),
    [
        ("another device committed in between", answer(cursor=14)),
        ("a cursor below our commit", answer(cursor=12)),
        ("no cursor (an older relay)", PushResponse(accepted=3)),
        ("accepted does not match the rejections", answer(accepted=3, rejected=["m1"])),
        ("a rejection of an id we did not send", answer(accepted=2, rejected=["zz"], cursor=12)),
        ("nothing accepted", answer(accepted=0, rejected=SENT, cursor=10)),
        ("a cursor above 2^63-1", answer(cursor=2**63)),
    ],
)
def test_any_other_answer_leaves_the_cursor_to_the_pull(why: str, response: PushResponse) -> None:
    assert own_commit_end(response, cursor=10, sent=SENT) is None, why


def blob(device: str, clock: int) -> SyncBlob:
    return SyncBlob(
        vault_id="v", memory_id="m", ciphertext="", hmac="", device_id=device,
        vector_clock=clock, created_at="2026-01-01T00:00:00Z", deleted=False,
    )  # fmt: skip


def test_our_own_blob_above_the_moved_cursor_refutes_the_move() -> None:
    skips = [OwnSkip(start=10, end=13, first_clock=5, last_clock=7)]
    assert refuted_start(skips, [blob("me", 6)], "me", asked=13) == 10
    # not a refutation: another device's blob, a clock we did not push, or a pull from
    # below the moved cursor (there our blobs belong)
    assert refuted_start(skips, [blob("other", 6)], "me", asked=13) is None
    assert refuted_start(skips, [blob("me", 8)], "me", asked=13) is None
    assert refuted_start(skips, [blob("me", 6)], "me", asked=12) is None


def test_moves_are_kept_in_the_state_file_bounded_and_checked(tmp_path: Path) -> None:
    state = SyncState.load(tmp_path)
    for n in range(MAX_OWN_SKIPS + 5):
        state.record_own_skip(OwnSkip(n, n + 1, n, n))
    state.save()
    again = SyncState.load(tmp_path)
    assert len(again.own_skips) == MAX_OWN_SKIPS
    assert again.own_skips[-1] == OwnSkip(MAX_OWN_SKIPS + 4, MAX_OWN_SKIPS + 5, 68, 68)
    assert OwnSkip.from_json({"start": 3, "end": 2, "first_clock": 1, "last_clock": 1}) is None
    assert OwnSkip.from_json({"start": 1, "end": 2, "first_clock": True, "last_clock": 1}) is None
    assert OwnSkip.from_json([1, 2, 3, 4]) is None
    assert OwnSkip.from_json({"start": 1, "end": 2, "first_clock": 1, "last_clock": 1}) == OwnSkip(
        1, 2, 1, 1
    )
