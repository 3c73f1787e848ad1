"""client._atomic.write_json_atomic writes, for the values our JSON files hold (strings,
integers, booleans, null, lists, dicts), the bytes `json.dump(indent=2, sort_keys=True,
ensure_ascii=False)` wrote before issue 36 made it msgspec's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engram_sync.client._atomic import read_json, write_json_atomic

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
