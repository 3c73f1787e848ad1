"""The plaintext codec (PROTOCOL §4): exact keys, sorted compact JSON, pull-side rules."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_sync.shared_format.errors import PlaintextError
from engram_sync.shared_format.plaintext import (
    SOURCES,
    Link,
    MemoryPlaintext,
    Tombstone,
    decode_plaintext,
    encode_memory,
    tombstone_plaintext,
)

from .vault_md import ENGRAM_SOURCES

PLAINTEXT_KEYS = {
    "id", "content", "layer", "scope", "content_type", "source", "privacy_level", "context",
    "created_at", "modified_at", "last_retrieved", "occurred_at", "project", "tags",
    "strength", "valence", "retrievals", "imagined", "grounded", "links", "embedding",
    "embedding_model",
}  # fmt: skip


def _memory(**changes: object) -> MemoryPlaintext:
    base = MemoryPlaintext(
        id="mem_1",
        content="Deploy with `make ship` — ünïcödé ✓",
        layer="semantic",
        scope="rule",
        content_type="text",
        source="ai-session",
        privacy_level="cloud_first",
        context={"z": 1, "a": {"y": [1, 2], "b": None}},
        created_at="2026-01-01T00:00:00.000000+00:00",
        modified_at="2026-01-02T00:00:00.000000+00:00",
        last_retrieved=None,
        occurred_at="2025-12-31T23:00:00+00:00",
        project="engram",
        tags=["deploy", "ops"],
        strength=1.5,
        valence=-0.25,
        retrievals=3,
        imagined=False,
        grounded=True,
        links=[Link(link_type="causal", target_id="mem_2", weight=0.75)],
        embedding=[0.1, -0.2, 3.0],
        embedding_model="all-MiniLM-L6-v2",
    )
    return msgspec.structs.replace(base, **changes)


def test_exact_keys_sorted_compact() -> None:
    text = encode_memory(_memory())
    obj = json.loads(text)
    assert set(obj) == PLAINTEXT_KEYS
    assert list(obj) == sorted(obj)
    assert list(obj["context"]) == ["a", "z"]  # nested keys sorted too
    assert list(obj["context"]["a"]) == ["b", "y"]
    assert list(obj["links"][0]) == ["link_type", "target_id", "weight"]
    assert ", " not in text
    assert ": " not in text
    assert text == json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_nulls_are_present_not_omitted() -> None:
    obj = json.loads(encode_memory(_memory(embedding=None, embedding_model=None, project=None)))
    assert obj["embedding"] is None
    assert obj["embedding_model"] is None
    assert obj["project"] is None
    assert obj["last_retrieved"] is None


def test_round_trip() -> None:
    memory = _memory()
    assert decode_plaintext(encode_memory(memory), expected_id="mem_1") == memory


def test_tombstone_exact_text() -> None:
    assert tombstone_plaintext("mem_9") == '{"deleted":true,"id":"mem_9"}'
    assert decode_plaintext(tombstone_plaintext("mem_9")) == Tombstone(id="mem_9")


def test_any_object_with_deleted_true_is_a_tombstone() -> None:
    text = encode_memory(_memory())
    obj = json.loads(text)
    obj["deleted"] = True
    assert decode_plaintext(json.dumps(obj)) == Tombstone(id="mem_1")
    obj["deleted"] = False
    assert isinstance(decode_plaintext(json.dumps(obj)), MemoryPlaintext)


def test_unknown_keys_are_ignored() -> None:
    obj = json.loads(encode_memory(_memory()))
    obj["future_field"] = {"anything": [1]}
    assert decode_plaintext(json.dumps(obj)) == _memory()


def test_the_known_sources_are_vault_md_s() -> None:
    assert SOURCES == ENGRAM_SOURCES


@pytest.mark.parametrize("source", ENGRAM_SOURCES)
def test_known_sources_are_kept(source: str) -> None:
    decoded = decode_plaintext(encode_memory(_memory(source=source)))
    assert isinstance(decoded, MemoryPlaintext)
    assert decoded.source == source


@pytest.mark.parametrize("source", ["ai_session", "AI-SESSION", "email", ""])
def test_unknown_source_becomes_system(source: str) -> None:
    decoded = decode_plaintext(encode_memory(_memory(source=source)))
    assert isinstance(decoded, MemoryPlaintext)
    assert decoded.source == "system"


@pytest.mark.parametrize(
    ("valence", "strength", "expected"),
    [
        (5.0, 9.0, (1.0, 2.0)),
        (-5.0, -1.0, (-1.0, 0.0)),
        (0.5, 1.25, (0.5, 1.25)),
        (-1.0, 2.0, (-1.0, 2.0)),
    ],
)
def test_clamping(valence: float, strength: float, expected: tuple[float, float]) -> None:
    decoded = decode_plaintext(encode_memory(_memory(valence=valence, strength=strength)))
    assert isinstance(decoded, MemoryPlaintext)
    assert (decoded.valence, decoded.strength) == expected


def test_missing_modified_at_falls_back_to_created_at() -> None:
    obj = json.loads(encode_memory(_memory()))
    del obj["modified_at"]
    decoded = decode_plaintext(json.dumps(obj))
    assert isinstance(decoded, MemoryPlaintext)
    assert decoded.modified_at == obj["created_at"]
    obj["modified_at"] = None
    decoded = decode_plaintext(json.dumps(obj))
    assert isinstance(decoded, MemoryPlaintext)
    assert decoded.modified_at == obj["created_at"]


def test_integers_accepted_for_floats() -> None:
    obj = json.loads(encode_memory(_memory()))
    obj["strength"], obj["valence"] = 1, 0
    decoded = decode_plaintext(json.dumps(obj))
    assert isinstance(decoded, MemoryPlaintext)
    assert (decoded.strength, decoded.valence) == (1.0, 0.0)


def test_unknown_link_type_drops_only_that_link() -> None:
    obj = json.loads(encode_memory(_memory()))
    obj["links"].append({"link_type": "telepathic", "target_id": "mem_3", "weight": 0.1})
    decoded = decode_plaintext(json.dumps(obj))
    assert isinstance(decoded, MemoryPlaintext)
    assert decoded.links == [Link(link_type="causal", target_id="mem_2", weight=0.75)]


def test_id_must_match_envelope() -> None:
    text = encode_memory(_memory())
    with pytest.raises(PlaintextError, match="memory_id"):
        decode_plaintext(text, expected_id="mem_other")
    with pytest.raises(PlaintextError, match="memory_id"):
        decode_plaintext(tombstone_plaintext("a"), expected_id="b")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        "null",
        '"mem"',
        "{}",
        '{"deleted":true}',
        '{"deleted":true,"id":5}',
        '{"id":"m","content":"c","layer":"dream","created_at":"x"}',
        '{"id":"m","content":7,"layer":"episodic","created_at":"x"}',
        '{"id":"m","content":"c","layer":"episodic","created_at":"x","tags":"a"}',
        '{"id":"m","content":"c","layer":"episodic","created_at":"x","privacy_level":"open"}',
        '{"id":"m","content":"c","layer":"episodic","created_at":"x","imagined":"yes"}',
    ],
)
def test_malformed_plaintexts_are_typed_errors(text: str) -> None:
    with pytest.raises(PlaintextError):
        decode_plaintext(text)


def test_non_finite_numbers_cannot_be_encoded() -> None:
    with pytest.raises(PlaintextError):
        encode_memory(_memory(valence=float("nan")))
    with pytest.raises(PlaintextError):
        encode_memory(_memory(embedding=[1.0, float("inf")]))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@given(
    content=st.text(),
    tags=st.lists(st.text(max_size=20), max_size=5),
    context=json_values,
    strength=st.floats(0, 2),
    valence=st.floats(-1, 1),
)
def test_round_trip_property(
    content: str, tags: list[str], context: object, strength: float, valence: float
) -> None:
    memory = _memory(
        content=content, tags=tags, context=context, strength=strength, valence=valence
    )
    assert decode_plaintext(encode_memory(memory)) == memory


def test_lone_surrogate_cannot_be_encoded() -> None:
    with pytest.raises(PlaintextError, match="surrogate"):
        encode_memory(_memory(content="a\ud800b"))
    assert '"content":"a\u00e9b"' in encode_memory(_memory(content="a\u00e9b"))


def test_deeply_nested_plaintext_is_a_typed_error() -> None:
    deep = '{"context":' + '{"a":' * 50_000 + "1" + "}" * 50_000 + ',"id":"m"}'
    with pytest.raises(PlaintextError, match="nested too deeply"):
        decode_plaintext(deep)
    nested_ok = json.loads(encode_memory(_memory(context={"a": {"b": {"c": [1]}}})))
    assert nested_ok["context"] == {"a": {"b": {"c": [1]}}}
