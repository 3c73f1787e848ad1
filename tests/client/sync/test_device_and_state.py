"""device.json, sync_state.json and config.json: atomic, crash-safe, preserving (PROTOCOL §8)."""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict
from pathlib import Path

import pytest

from engram_sync.client._sync.config import SyncConfig, load_sync_config, save_sync_config
from engram_sync.client._sync.device import CLOCK_LEASE, ClockExhaustedError, Device
from engram_sync.client._sync.own_pushes import OwnSkip
from engram_sync.client._sync.state import RetiredHint, SkippedBlob, SyncState


def test_device_is_created_once_with_a_uuid4(tmp_path: Path) -> None:
    first = Device.load_or_create(tmp_path, label="laptop")
    assert uuid.UUID(first.device_id).version == 4
    again = Device.load_or_create(tmp_path)
    assert again.device_id == first.device_id
    assert again.label == "laptop"
    data = json.loads((tmp_path / "device.json").read_text())
    assert set(data) == {"device_id", "created_at", "label", "vector_clock"}
    assert (tmp_path / "device.json").stat().st_mode & 0o777 == 0o600


def _mark_on_disk(vault_dir: Path) -> int:
    return int(json.loads((vault_dir / "device.json").read_text())["vector_clock"])


def test_clocks_are_persisted_before_use(tmp_path: Path) -> None:
    device = Device.load_or_create(tmp_path)
    assert device.reserve_clocks(3) == [1, 2, 3]
    assert _mark_on_disk(tmp_path) >= 3  # the lease's mark, written before the clocks are used
    # a crash right after reserving: a new process must never hand out 1..3 again
    reloaded = Device.load_or_create(tmp_path)
    assert reloaded.vector_clock >= 3
    first, second = reloaded.reserve_clocks(2)
    assert 3 < first < second == first + 1
    assert reloaded.reserve_clocks(0) == []
    assert not list(tmp_path.glob(".*.tmp"))


def test_clocks_are_leased_in_blocks(tmp_path: Path) -> None:
    """issue 15: one write of device.json per CLOCK_LEASE clocks, never a clock above it."""
    device = Device.load_or_create(tmp_path)
    device.reserve_clocks(1)
    mark = _mark_on_disk(tmp_path)
    assert mark == 1 + CLOCK_LEASE
    written = (tmp_path / "device.json").stat().st_ino
    handed = [device.reserve_clocks(1)[0] for _ in range(CLOCK_LEASE - 1)]
    assert handed == list(range(2, CLOCK_LEASE + 1))
    assert max(handed) <= mark == _mark_on_disk(tmp_path)  # from memory: no new lease
    assert (tmp_path / "device.json").stat().st_ino == written  # not replaced
    clocks = device.reserve_clocks(5)  # passes the mark: a new lease first
    assert clocks[0] == CLOCK_LEASE + 1
    assert _mark_on_disk(tmp_path) == clocks[-1] + CLOCK_LEASE


def test_another_process_lease_moves_ours_above_it(tmp_path: Path) -> None:
    ours = Device.load_or_create(tmp_path)
    ours.reserve_clocks(1)
    ours.refresh()  # our own mark on disk: the lease stays
    assert ours.reserve_clocks(1) == [2]
    other = Device.load_or_create(tmp_path)
    other.reserve_clocks(1)
    others_mark = _mark_on_disk(tmp_path)  # the other process may hand out clocks up to it
    ours.refresh()
    assert ours.reserve_clocks(1) == [others_mark + 1]


def test_observe_only_raises(tmp_path: Path) -> None:
    device = Device.load_or_create(tmp_path)
    device.observe(41)
    device.observe(7)
    assert Device.load_or_create(tmp_path).vector_clock >= 41  # a restart starts above it
    assert device.reserve_clocks(1) == [42]


def test_observed_clocks_within_the_lease_write_nothing(tmp_path: Path) -> None:
    device = Device.load_or_create(tmp_path)
    device.observe(41)  # past the lease: a new mark, a lease above the observed clock
    mark, written = _mark_on_disk(tmp_path), (tmp_path / "device.json").stat().st_ino
    assert mark == 41 + CLOCK_LEASE
    for clock in range(42, mark + 1):  # a device that only receives, one clock at a time
        device.observe(clock)
    assert (tmp_path / "device.json").stat().st_ino == written  # not rewritten
    assert device.reserve_clocks(1) == [mark + 1]  # and its own clocks go on above them
    leased = _mark_on_disk(tmp_path)
    device.observe(leased + 5)  # past the lease again: written once more
    assert _mark_on_disk(tmp_path) == leased + 5 + CLOCK_LEASE


def test_clock_cannot_pass_signed_64_bits(tmp_path: Path) -> None:
    device = Device.load_or_create(tmp_path)
    device.observe(2**63 - 2)
    assert device.reserve_clocks(1) == [2**63 - 1]
    with pytest.raises(ClockExhaustedError):
        device.reserve_clocks(1)


def test_corrupt_device_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "device.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Device.load_or_create(tmp_path)
    (tmp_path / "device.json").write_text('{"label": "x"}')
    with pytest.raises(ValueError, match="not a valid device file"):
        Device.load_or_create(tmp_path)


def test_state_survives_and_rebinds(tmp_path: Path) -> None:
    state = SyncState.load(tmp_path)
    state.bind("http://relay", "v1")
    state.cursor = 17
    state.record_skipped(SkippedBlob("m", "d", 3, "BlobTamperedError", "now"))
    state.save()
    loaded = SyncState.load(tmp_path)
    assert loaded.cursor == 17
    assert loaded.skipped[0].memory_id == "m"
    loaded.bind("http://relay", "v1")
    assert loaded.cursor == 17  # same relay and vault: resume
    loaded.bind("http://other-relay", "v1")
    assert loaded.cursor == 0  # another relay: start over
    assert SyncState.load(tmp_path).cursor == 0


def test_sync_config_keeps_other_settings(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"llm": {"model": "x"}, "sync": {}}))
    assert load_sync_config(tmp_path) == SyncConfig()
    config = SyncConfig(True, "http://relay", "en_secretsecret", "team", 60)
    save_sync_config(tmp_path, config)
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["llm"] == {"model": "x"}
    assert data["sync"] == {
        "enabled": True,
        "server_url": "http://relay",
        "api_key": "en_secretsecret",
        "vault_id": "team",
        "interval_secs": 60,
    }
    assert load_sync_config(tmp_path) == config
    assert "en_secretsecret" not in repr(config)
    assert (tmp_path / "config.json").stat().st_mode & 0o777 == 0o600


def test_the_state_file_holds_what_asdict_gave(tmp_path: Path) -> None:
    """issue 36: `SyncState._payload` (msgspec) is `dataclasses.asdict` without `path`."""
    state = SyncState.load(tmp_path)
    state.bind("https://relay.example", "vault-ü")
    state.cursor, state.generation, state.oversized = 42, "g1", ["mem-1"]
    state.record_skipped(SkippedBlob("m", "d", 3, "bad hmac", "2026-12-05T00:00:00Z", "k"))
    for n in range(70):  # past MAX_OWN_SKIPS
        state.record_own_skip(OwnSkip(n, n + 1, n, n))
    state.retired = RetiredHint("vault-ü", "next", None, "pull", "2026-12-05T00:00:00Z")
    state.save()
    expected = asdict(state)
    expected.pop("path")
    assert json.loads((tmp_path / "sync_state.json").read_text()) == expected
    again = SyncState.load(tmp_path)
    assert asdict(again) == asdict(state)
    again.save()  # equal to the file: not written again
    assert again._payload() == expected
