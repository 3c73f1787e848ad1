"""What one sync reports: its counts (`SyncReport`) and its anti-entropy check's
(`DigestReport`), in a module of their own so that the engine and the helpers it calls
(anti_entropy, strict_local) all import them from below (issue 32: no circles)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .unpushable import Unpushable


@dataclass
class DigestReport:
    """What one anti-entropy check found and did (in SyncReport.digest and `verify`)."""

    checked: bool = False  # the relay offers the digest and it was compared
    matched: bool = False  # equal at the end
    relay_digest: str = ""
    device_digest: str = ""
    relay_count: int = 0
    device_count: int = 0
    buckets: list[int] = field(default_factory=list)  # buckets that differed
    device_lacks: int = 0  # versions the relay holds that beat the device's (or it lacks)
    relay_lacks: int = 0  # versions the device holds that the relay lacks
    fetched: int = 0  # of those the device lacked: applied after verification
    restored: int = 0  # rows written back at their known version (see the module doc)
    requeued: int = 0  # versions queued to push again
    compacted: int = 0  # tombstones the relay compacted, left out of the digest
    unresolved: list[str] = field(default_factory=list)  # memory ids
    # digest requests, plus 1 when the digest a push or pull answer carried (`carried`)
    # settled the check: the one small answer it rests on
    round_trips: int = 0
    answer_bytes: int = 0  # JSON bytes of the digest answers (as re-encoded)
    request_bytes: int = 0  # JSON bytes of the digest requests' bodies (narrow)
    error: str | None = None  # a digest answer refused as impossible (nothing was changed)
    behind: bool = False  # not narrowed: the relay's digest counts commits not pulled yet
    # the device's kept digest disagreed with its rows and was recomputed (issue 36; seen
    # by `verify --deep` and by a check that narrows)
    kept_repaired: bool = False
    # the check began with the relay's digest as a push answer or the last pull page
    # carried it (ours, docs/digest.md "Carried in push and pull answers")
    carried: bool = False


@dataclass
class SyncReport:
    """Counts of one sync, for progress bars, `--json` and tests."""

    pushed: int = 0
    rejected: int = 0
    pulled: int = 0
    applied: int = 0
    stale: int = 0
    invalid: int = 0
    conflicts: int = 0
    resynced: bool = False
    restored: bool = False  # the relay lost commits this device had seen (PROTOCOL §17)
    repushed: int = 0  # versions the relay lacked, queued again by a reconcile
    cursor: int = 0
    oversized: list[str] = field(default_factory=list)
    # issue 31 (client._sync.unpushable): memories kept local because the relay refuses
    # their blob as structurally invalid (PROTOCOL §6 step 1), e.g. an id it refuses
    unpushable: list[Unpushable] = field(default_factory=list)
    # PROTOCOL §18: the anti-entropy check at the end of the sync (None: the relay does not
    # offer the digest, or the sync was told not to check)
    digest: DigestReport | None = None
    # issue 15 (client._sync.own_pushes): own blobs the cursor moved past without pulling
    # them back, and whether a page showed that such a move was wrong (pulled again)
    own_skipped: int = 0
    own_skip_refuted: bool = False
    # docs/live-feed.md "Blobs in the event": pages the live feed carried, applied in place
    # of a pull, and those dropped by a check (pulled over HTTP instead; logged)
    feed_pages: int = 0
    feed_dropped: int = 0


ProgressCallback = Callable[[str, SyncReport], None]
