"""What `engram-sync sync` says of the memories it kept local (issue 31): one line each, at
most SHOWN_UNPUSHABLE of each kind named, the rest counted; ids shown escaped."""

from __future__ import annotations

from engram_sync.client._cli.sync_command import SHOWN_UNPUSHABLE, kept_local_lines
from engram_sync.client._sync.reports import SyncReport
from engram_sync.client._sync.unpushable import Unpushable


def test_each_kept_memory_is_named_once_and_the_rest_counted() -> None:
    report = SyncReport()
    report.unpushable = [Unpushable("mem_bad\x07id", "its id has control characters")]
    report.oversized = [f"big-{n}" for n in range(SHOWN_UNPUSHABLE + 5)]
    lines = kept_local_lines(report)
    assert lines[0] == (
        "not pushed: memory 'mem_bad\\x07id': its id has control characters; it stays in this "
        "vault only (add its content again with `engram-sync add`, then delete it)"
    )
    too_large = [line for line in lines if "larger than the relay takes" in line]
    assert len(too_large) == SHOWN_UNPUSHABLE
    assert "big-0" in too_large[0]
    assert "shorten it with `engram-sync edit`, or split it" in too_large[0]
    assert lines[-1] == "  ... and 5 more too large"
    assert len(lines) == 1 + SHOWN_UNPUSHABLE + 1


def test_a_clean_sync_says_nothing_of_kept_memories() -> None:
    assert kept_local_lines(SyncReport()) == []
