"""This device's sync identity and Lamport clock: `device.json` (PROTOCOL §1, §8).

`{"device_id", "created_at", "label", "vector_clock"}`, written atomically.

The clock is leased in blocks (issue 15; docs/live-sync.md "Clock leases"): the file's
`vector_clock` is a high-water mark, never below any clock this device handed out. A
reservation that needs more than the lease holds persists `last + CLOCK_LEASE` once, fsynced
**before** a blob carrying one of its clocks leaves the device; the clocks up to the mark are
then handed out from memory. A process that starts (after a crash or not) resumes above the
mark, so no clock value is ever reused; the unused rest of a lease is a gap, which PROTOCOL
§1/§8 allow (a device's clocks only need to increase).
"""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from engram_sync.shared_format.timestamps import utc_now_rfc3339
from engram_sync.shared_format.wire import MAX_VECTOR_CLOCK

from .._atomic import read_json, write_json_atomic
from .._errors import SyncError

DEVICE_FILE: Final = "device.json"
# issue 15: clocks handed out per write of device.json (one fsync per CLOCK_LEASE clocks)
CLOCK_LEASE: Final = 64


class ClockExhaustedError(SyncError):
    """The device clock cannot take another value (PROTOCOL §1: it must stay < 2^63)."""


@dataclass
class Device:
    """The device identity of one vault directory."""

    path: Path
    device_id: str
    created_at: str
    label: str
    vector_clock: int  # the highest clock handed out or observed
    leased_to: int = -1  # the mark on disk (-1: not given, the clock itself)

    def __post_init__(self) -> None:
        self.leased_to = max(self.leased_to, self.vector_clock)

    @classmethod
    def load_or_create(cls, vault_dir: Path, label: str | None = None) -> Device:
        """Read `device.json`, or create it with a new UUIDv4 and clock 0."""
        path = vault_dir / DEVICE_FILE
        if path.exists():
            data = read_json(path)
            try:
                device = cls(
                    path=path,
                    device_id=str(data["device_id"]),
                    created_at=str(data["created_at"]),
                    label=str(data.get("label") or socket.gethostname()),
                    vector_clock=int(data.get("vector_clock", 0)),
                )
            except (KeyError, TypeError, ValueError):
                raise ValueError(
                    f"{path} is not a valid device file; restore it from a backup"
                ) from None
            if label is not None and label != device.label:
                device.label = label
                device.save()
            return device
        device = cls(
            path=path,
            device_id=str(uuid.uuid4()),
            created_at=utc_now_rfc3339(),
            label=label or socket.gethostname(),
            vector_clock=0,
        )
        device.save()
        return device

    def save(self) -> None:
        """Persist atomically."""
        write_json_atomic(
            self.path,
            {
                "device_id": self.device_id,
                "created_at": self.created_at,
                "label": self.label,
                "vector_clock": max(self.leased_to, self.vector_clock),
            },
        )

    def renew_identity(self) -> str:
        """Take a new device id (UUIDv4), keeping the label and the clock: the relay revoked
        the old id, which stays revoked there (client._sync.revocation; PROTOCOL §10). The
        clock goes on above every value handed out (PROTOCOL §8), so the new id's pushes
        beat what the old id wrote. Returns the old id."""
        old = self.device_id
        self.device_id = str(uuid.uuid4())
        self.created_at = utc_now_rfc3339()
        self.save()
        return old

    def reserve_clocks(self, count: int) -> list[int]:
        """Take `count` consecutive clock values, each at or below a mark persisted before
        they are returned (a new lease when the current one does not cover them)."""
        if count <= 0:
            return []
        first = self.vector_clock + 1
        last = self.vector_clock + count
        if last > MAX_VECTOR_CLOCK:
            raise ClockExhaustedError(
                f"this device's clock ({self.vector_clock}) would pass 2^63-1, so it cannot "
                "push; a blob with a huge clock raised it (versions before the clock bound "
                "let that happen): make a new vault directory, link it and move the "
                "memories over with `engram-sync conflicts`/`add`, and tell the vault's admin"
            )
        self.vector_clock = last
        if last > self.leased_to:
            self._lease_from(last)
        return list(range(first, last + 1))

    def _lease_from(self, clock: int) -> None:
        """Persist the mark `clock + CLOCK_LEASE` (at most 2^63-1, PROTOCOL §1)."""
        self.leased_to = min(clock + CLOCK_LEASE, MAX_VECTOR_CLOCK)
        self.save()

    def refresh(self) -> None:
        """Take the mark on disk when another process moved it past our lease: that process
        may hand out clocks up to it, so ours continue above it."""
        try:
            on_disk = int(read_json(self.path).get("vector_clock", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            return
        if on_disk > self.leased_to:
            self.vector_clock = self.leased_to = on_disk

    def observe(self, remote_clock: int) -> None:
        """Raise the clock to at least a verified remote clock (PROTOCOL §1); persisted
        only when it passes the lease, and then as a new lease above it: a device that
        only receives (each memory one clock above the last) writes device.json once per
        CLOCK_LEASE clocks, not once per memory (the mark is a high-water mark: a gap
        above the observed clock is as harmless as the rest of any lease)."""
        if remote_clock > self.vector_clock:
            self.vector_clock = remote_clock
            if remote_clock > self.leased_to:
                self._lease_from(remote_clock)
