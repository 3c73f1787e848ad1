"""This device's sync identity and Lamport clock: `device.json` (PROTOCOL §1, §8).

`{"device_id", "created_at", "label", "vector_clock"}`, written atomically. The
clock is persisted **before** a blob carrying it leaves the device, so a crash
never reuses a clock value.
"""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from engram_sync.client._atomic import read_json, write_json_atomic
from engram_sync.client._errors import SyncError
from engram_sync.shared_format.timestamps import utc_now_rfc3339
from engram_sync.shared_format.wire import MAX_VECTOR_CLOCK

DEVICE_FILE: Final = "device.json"


class ClockExhaustedError(SyncError):
    """The device clock cannot take another value (PROTOCOL §1: it must stay < 2^63)."""


@dataclass
class Device:
    """The device identity of one vault directory."""

    path: Path
    device_id: str
    created_at: str
    label: str
    vector_clock: int

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
                "vector_clock": self.vector_clock,
            },
        )

    def reserve_clocks(self, count: int) -> list[int]:
        """Take `count` consecutive clock values, persisted before they are returned."""
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
        self.save()
        return list(range(first, last + 1))

    def refresh(self) -> None:
        """Take the clock on disk when another process moved it past ours."""
        try:
            on_disk = int(read_json(self.path).get("vector_clock", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            return
        if on_disk > self.vector_clock:
            self.vector_clock = on_disk

    def observe(self, remote_clock: int) -> None:
        """Raise the clock to at least a verified remote clock (PROTOCOL §1)."""
        if remote_clock > self.vector_clock:
            self.vector_clock = remote_clock
            self.save()
