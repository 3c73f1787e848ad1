"""client._atomic.write_json_atomic writes, for the values our JSON files hold (strings,
integers, booleans, null, lists, dicts), the bytes `json.dump(indent=2, sort_keys=True,
ensure_ascii=False)` wrote before issue 36 made it msgspec's; and which files skip the
directory's fsync."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engram_sync.client._atomic import read_json, write_json_atomic
from engram_sync.client._sync import state as state_module
from engram_sync.client._sync.device import Device
from engram_sync.client._sync.state import SyncState

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.text()  # every code point: quotes, controls, non-ASCII, U+2028, surrogates' neighbours
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _before(payload: Any) -> str:
    return json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


@settings(max_examples=300, deadline=None)
@given(payload=st.dictionaries(st.text(), _VALUES, max_size=6))
def test_the_same_bytes_as_json_dump(tmp_path_factory: Any, payload: dict[str, Any]) -> None:
    path = Path(tmp_path_factory.mktemp("atomic")) / "file.json"
    write_json_atomic(path, payload)
    assert path.read_text(encoding="utf-8") == _before(payload)
    assert read_json(path) == payload


def test_only_the_sync_state_skips_the_directory_fsync(tmp_path: Path, monkeypatch: Any) -> None:
    """sync_state.json may come back as its previous version after a crash (a cursor behind
    committed rows), so its save does without the directory's fsync; device.json's clock
    (PROTOCOL §8) and every other file keep both fsyncs. The content is fsynced either way."""
    synced: list[bool] = []  # True: a directory's fsync
    real = os.fsync

    def counting(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    state = SyncState.load(tmp_path)
    state.cursor = 7
    state.save()
    assert synced == [False]
    synced.clear()
    device = Device.load_or_create(tmp_path, "a label")
    assert synced == [False, True]
    synced.clear()
    device.save()
    write_json_atomic(tmp_path / "other.json", {"x": 1})
    assert synced == [False, True, False, True]
    assert SyncState.load(tmp_path).cursor == 7


def test_a_refresh_takes_another_writer_s_state_and_parses_nothing_unchanged(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """SyncState.refresh (each sync's start) parses the file only when its bytes are not the
    ones this object last read or wrote, or when this object holds a change it did not save
    (which the file's state replaces, as before)."""
    first = SyncState.load(tmp_path)
    first.cursor = 3
    first.save()
    other = SyncState.load(tmp_path)  # another process
    other.cursor = 9
    other.save()
    first.refresh()
    assert first.cursor == 9  # the other writer's state taken
    parsed: list[Path] = []
    real = state_module.parse_json

    def counting(raw: bytes, path: Path) -> Any:
        parsed.append(path)
        return real(raw, path)

    monkeypatch.setattr(state_module, "parse_json", counting)
    first.refresh()
    assert (first.cursor, parsed) == (9, [])  # unchanged: nothing parsed
    first.cursor = 42  # not saved: the file's state replaces it, as before
    first.refresh()
    assert (first.cursor, len(parsed)) == (9, 1)
