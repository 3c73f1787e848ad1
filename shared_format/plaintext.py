"""The plaintext inside a blob (PROTOCOL §4).

A live memory is compact JSON with sorted keys and exactly the listed keys; a
tombstone is `{"deleted":true,"id":…}`. Decoding ignores unknown keys and
applies the pull-side normalisation: unknown source → `system`, valence
clamped to [-1, 1], strength to [0, 2], missing modified_at → created_at.
"""

from __future__ import annotations

import math
from typing import Any, Final, Literal, get_args

import msgspec
from msgspec import Struct

from .errors import PlaintextError

Layer = Literal["episodic", "semantic", "imagined"]
PrivacyLevel = Literal["strict_local", "hybrid", "cloud_first", "enterprise"]
LinkType = Literal["associative", "causal", "analogical", "temporal"]

# VAULT §3 CHECK list of engrams.source, in the database spelling and VAULT.md's order; the
# vault schema (shared_format/vault/schema.py) builds its CHECK from this one list.
SOURCES: Final = (
    "interaction", "sensor", "consolidation", "imagined", "chat", "slack", "discord",
    "telegram", "window", "mic", "agent", "research", "system", "user", "observation",
    "ai-session", "ai-tool",
)  # fmt: skip
LINK_TYPES: Final = frozenset(get_args(LinkType))
VALENCE_RANGE: Final = (-1.0, 1.0)
STRENGTH_RANGE: Final = (0.0, 2.0)


class Link(Struct, frozen=True):
    """One outgoing `engram_links` row."""

    link_type: LinkType
    target_id: str
    weight: float


class MemoryPlaintext(Struct, frozen=True):
    """A live memory as it travels inside a blob (PROTOCOL §4), all keys present."""

    id: str
    content: str
    layer: Layer
    scope: str
    content_type: str
    source: str
    privacy_level: PrivacyLevel
    context: Any
    created_at: str
    modified_at: str
    last_retrieved: str | None
    occurred_at: str | None
    project: str | None
    tags: list[str]
    strength: float
    valence: float
    retrievals: int
    imagined: bool
    grounded: bool
    links: list[Link]
    embedding: list[float] | None
    embedding_model: str | None


class Tombstone(Struct, frozen=True):
    """A deletion (PROTOCOL §4)."""

    id: str
    deleted: bool = True


class _IncomingLink(Struct):
    link_type: str
    target_id: str
    weight: float = 0.5


class _IncomingMemory(Struct):
    """What a reader accepts: required core, defaults for the rest, unknown keys ignored."""

    id: str
    content: str
    layer: Layer
    created_at: str
    scope: str = "moment"
    content_type: str = "text"
    source: str = "interaction"
    privacy_level: PrivacyLevel = "cloud_first"
    context: Any = msgspec.field(default_factory=dict)
    modified_at: str | None = None
    last_retrieved: str | None = None
    occurred_at: str | None = None
    project: str | None = None
    tags: list[str] = msgspec.field(default_factory=list)
    strength: float = 1.0
    valence: float = 0.0
    retrievals: int = 0
    imagined: bool = False
    grounded: bool = False
    links: list[_IncomingLink] = msgspec.field(default_factory=list)
    embedding: list[float] | None = None
    embedding_model: str | None = None


class _DeletedProbe(Struct):
    deleted: Any = False
    id: Any = None


def tombstone_plaintext(memory_id: str) -> str:
    """The exact tombstone plaintext `{"deleted":true,"id":"…"}` (PROTOCOL §4)."""
    return msgspec.json.encode({"deleted": True, "id": memory_id}, order="sorted").decode()


def encode_memory(memory: MemoryPlaintext) -> str:
    """Compact JSON, keys sorted at every level (PROTOCOL §4)."""
    for name, value in (("strength", memory.strength), ("valence", memory.valence)):
        if not math.isfinite(value):
            raise PlaintextError(f"{name} must be a finite number")
    if memory.embedding is not None and not all(math.isfinite(v) for v in memory.embedding):
        raise PlaintextError("embedding values must be finite numbers")
    try:
        return msgspec.json.encode(memory, order="sorted").decode()
    except UnicodeEncodeError:
        raise PlaintextError("memory text is not valid Unicode (lone surrogate)") from None


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    low, high = bounds
    return min(max(value, low), high)


def _normalise(incoming: _IncomingMemory) -> MemoryPlaintext:
    # PROTOCOL §4 / VAULT §5: pull-side normalisation rules.
    return MemoryPlaintext(
        id=incoming.id,
        content=incoming.content,
        layer=incoming.layer,
        scope=incoming.scope,
        content_type=incoming.content_type,
        source=incoming.source if incoming.source in SOURCES else "system",
        privacy_level=incoming.privacy_level,
        context=incoming.context,
        created_at=incoming.created_at,
        modified_at=incoming.modified_at or incoming.created_at,
        last_retrieved=incoming.last_retrieved,
        occurred_at=incoming.occurred_at,
        project=incoming.project,
        tags=incoming.tags,
        strength=_clamp(incoming.strength, STRENGTH_RANGE),
        valence=_clamp(incoming.valence, VALENCE_RANGE),
        retrievals=incoming.retrievals,
        imagined=incoming.imagined,
        grounded=incoming.grounded,
        # A link type this version does not know cannot be stored (VAULT §3 CHECK):
        # keep the memory, drop that link.
        links=[
            Link(link_type=link.link_type, target_id=link.target_id, weight=link.weight)  # type: ignore[arg-type]
            for link in incoming.links
            if link.link_type in LINK_TYPES
        ],
        embedding=incoming.embedding,
        embedding_model=incoming.embedding_model,
    )


def decode_plaintext(text: str, expected_id: str | None = None) -> MemoryPlaintext | Tombstone:
    """Decode a decrypted plaintext into a memory or a tombstone.

    Any object with `"deleted": true` is a tombstone. When `expected_id` is
    given (the envelope's memory_id), a different `id` is a PlaintextError.
    """
    try:
        probe = msgspec.json.decode(text, type=_DeletedProbe)
    except msgspec.DecodeError as exc:
        raise PlaintextError(f"plaintext is not a JSON object: {exc}") from None
    except RecursionError:
        raise PlaintextError("plaintext JSON is nested too deeply") from None
    result: MemoryPlaintext | Tombstone
    if probe.deleted is True:
        if not isinstance(probe.id, str):
            raise PlaintextError("tombstone plaintext lacks a string `id`")
        result = Tombstone(id=probe.id)
    else:
        try:
            result = _normalise(msgspec.json.decode(text, type=_IncomingMemory))
        except msgspec.ValidationError as exc:
            raise PlaintextError(f"plaintext is not a valid memory: {exc}") from None
        except RecursionError:
            raise PlaintextError("plaintext JSON is nested too deeply") from None
    if expected_id is not None and result.id != expected_id:
        raise PlaintextError("plaintext id does not match the blob's memory_id")
    return result
