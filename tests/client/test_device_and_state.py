"""device.json, sync_state.json and config.json: atomic, crash-safe, preserving (PROTOCOL §8)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from engram_sync.client._sync.config import SyncConfig, load_sync_config, save_sync_config
from engram_sync.client._sync.device import ClockExhaustedError, Device
from engram_sync.client._sync.state import SkippedBlob, SyncState


def test_device_is_created_once_with_a_uuid4(tmp_path: Path) -> None:
    first = Device.load_or_create(tmp_path, label="laptop")
    assert uuid.UUID(first.device_id).version == 4
    again = Device.load_or_create(tmp_path)
    assert again.device_id == first.device_id
    assert again.label == "laptop"
    data = json.loads((tmp_path / "device.json").read_text())
    assert set(data) == {"device_id", "created_at", "label", "vector_clock"}
    assert (tmp_path / "device.json").stat().st_mode & 0o777 == 0o600


def test_clocks_are_persisted_before_use(tmp_path: Path) -> None:
    device = Device.load_or_create(tmp_path)
    assert device.reserve_clocks(3) == [1, 2, 3]
    # a crash right after reserving: a new process must never hand out 1..3 again
    reloaded = Device.load_or_create(tmp_path)
    assert reloaded.vector_clock == 3
    assert reloaded.reserve_clocks(2) == [4, 5]
    assert reloaded.reserve_clocks(0) == []
    assert not list(tmp_path.glob(".*.tmp"))


def test_observe_only_raises(tmp_path: Path) -> None:
    device = Device.load_or_create(tmp_path)
    device.observe(41)
    device.observe(7)
    assert Device.load_or_create(tmp_path).vector_clock == 41
    assert device.reserve_clocks(1) == [42]


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
