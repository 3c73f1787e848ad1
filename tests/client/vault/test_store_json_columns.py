"""The tags and context columns read back (client._vault.store.json_or): msgspec's decoder
first, json.loads for what it refuses, so every text reads as json.loads reads it, and a
text that is not JSON gives the default."""

from __future__ import annotations

import json
import math

import pytest

from engram_sync.client._vault.store import json_or

# what json.loads accepts and msgspec refuses (the fallback), and ordinary texts
JSON_TEXTS = [
    '["a", "b"]',
    '{"k": [1, 2.5, null, true], "a": 1, "a": 2}',
    "123456789012345678901234567890",
    "1e400",
    "-0.0",
    '"\\ud800"',
    "[NaN, Infinity, -Infinity]",
    ' {"é": "\\u00e9\\n"} ',
]


@pytest.mark.parametrize("text", JSON_TEXTS)
def test_a_json_text_reads_as_json_loads_reads_it(text: str) -> None:
    expected = json.loads(text)
    got = json_or(text, "default")
    assert repr(got) == repr(expected)  # repr: nan == nan is False, -0.0 == 0.0 is True
    assert type(got) is type(expected)


def test_the_fallback_keeps_json_loads_special_numbers() -> None:
    got = json_or("[NaN, Infinity]", [])
    assert math.isnan(got[0])
    assert got[1] == math.inf


@pytest.mark.parametrize("text", ["{not json", "[1, 2", "'single'", None, ""])
def test_a_text_that_is_not_json_gives_the_default(text: str | None) -> None:
    assert json_or(text, ["the default"]) == ["the default"]
