"""Wire types of the sync protocol as msgspec Structs (PROTOCOL §3, §5, §9, §11).

Field names and defaults are those of the compatible core. Decoding ignores
unknown fields (the format evolves additively); additive fields of ours
(`cursor`) are `UNSET` by default and then not emitted at all, so a writer
never sends a core field with a different type.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, TypeVar

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from shared_format.errors import WireDecodeError

MAX_BLOBS_PER_PUSH: Final = 1000  # PROTOCOL §5
MAX_PULL_LIMIT: Final = 1000  # PROTOCOL §5
DEFAULT_PULL_LIMIT: Final = 1000  # PROTOCOL §5
# A Lamport counter: u64 on the wire, but it must fit a signed 64-bit integer on
# the relay (PROTOCOL §1, §6 step 1), so decoding refuses anything >= 2^63.
MAX_VECTOR_CLOCK: Final = 2**63 - 1

VectorClock = Annotated[int, Meta(ge=0, le=MAX_VECTOR_CLOCK)]
Cursor = Annotated[int, Meta(ge=0)]


class SyncBlob(Struct, frozen=True):
    """One encrypted version of one memory, or a tombstone (PROTOCOL §3)."""

    vault_id: str
    memory_id: str
    device_id: str
    vector_clock: VectorClock
    ciphertext: str
    hmac: str
    created_at: str
    deleted: bool  # required, no default (PROTOCOL §3)


class PushRequest(Struct, frozen=True):
    """Body of `POST /v1/vaults/{vault_id}/push` (PROTOCOL §5)."""

    blobs: list[SyncBlob]


class PushResponse(Struct, frozen=True):
    """Answer to a push (PROTOCOL §5); `cursor` is our addition (§9)."""

    accepted: int
    rejected: list[str] = msgspec.field(default_factory=list)
    revoked_devices: list[str] = msgspec.field(default_factory=list)
    cursor: Cursor | UnsetType = UNSET


class PullRequest(Struct, frozen=True):
    """Query of `GET /v1/vaults/{vault_id}/pull` (PROTOCOL §5, §7, §9).

    `since` empty means none; `cursor` selects the commit-ordered mode of §9.
    """

    since: str | None = None
    limit: Annotated[int, Meta(ge=0)] = DEFAULT_PULL_LIMIT
    cursor: Cursor | None = None

    def capped_limit(self) -> int:
        """The limit the relay applies: capped at MAX_PULL_LIMIT (PROTOCOL §5)."""
        return min(self.limit, MAX_PULL_LIMIT)


class PullResponse(Struct, frozen=True):
    """Answer to a pull (PROTOCOL §5); `cursor` is our addition (§9)."""

    blobs: list[SyncBlob]
    has_more: bool
    cursor: Cursor | UnsetType = UNSET


class SyncHealth(Struct, frozen=True):
    """`GET /health` (PROTOCOL §5); `total_blobs` counts live blobs."""

    status: str
    version: str
    uptime_secs: int
    vaults: int
    total_blobs: int
    db_size_bytes: int


class VaultStats(Struct, frozen=True):
    """`GET /v1/vaults/{vault_id}/stats` and its `/sync/{vault_id}/stats` alias (PROTOCOL §5)."""

    vault_id: str
    total_blobs: int
    latest_sync: str | None


class DeviceEntry(Struct, frozen=True):
    """One row of the device roster (PROTOCOL §5)."""

    device_id: str
    last_seen: str | None
    blob_count: int
    revoked: bool
    label: str | None


class DeviceRoster(Struct, frozen=True):
    """`GET /v1/vaults/{vault_id}/devices` (PROTOCOL §5), newest first."""

    vault_id: str
    devices: list[DeviceEntry]


class RegisterDeviceRequest(Struct, frozen=True):
    """Body of `POST /v1/vaults/{vault_id}/devices/register` (PROTOCOL §5)."""

    device_id: str
    label: str


class DeviceRegistered(Struct, frozen=True):
    """Answer to a device registration (PROTOCOL §5)."""

    vault_id: str
    device_id: str
    label: str
    registered: bool = True


class DeviceRevoked(Struct, frozen=True):
    """Answer to `DELETE /v1/vaults/{vault_id}/devices/{device_id}` (PROTOCOL §5)."""

    vault_id: str
    device_id: str
    revoked: bool = True


class RelayInfo(Struct, frozen=True):
    """`GET /v1/info`, the limits advertisement (PROTOCOL §11)."""

    protocol: str
    max_blobs_per_push: int
    max_blob_bytes: int
    max_pull_limit: int
    max_body_bytes: int
    features: list[str] = msgspec.field(default_factory=list)


class ErrorBody(Struct, frozen=True):
    """The relay's JSON error body (PROTOCOL §5); extra detail is additive."""

    error: str
    code: str


class QuotaErrorDetail(Struct, frozen=True):
    """Inner object of the 402 quota body (PROTOCOL §5)."""

    code: str
    detail: str
    limit: int
    used: int


class QuotaErrorBody(Struct, frozen=True):
    """The exact 402 body: `{"error":{"code":"quota_exceeded","detail",...}}` (PROTOCOL §5)."""

    error: QuotaErrorDetail


T = TypeVar("T")

_PATH_RE = re.compile(r" - at `(?P<path>\$[^`]*)`$")
_MISSING_RE = re.compile(r"^Object missing required field `(?P<name>[^`]*)`")


def _field_of(message: str) -> str | None:
    """The JSON path msgspec names, extended with the missing field's name if any."""
    path_match = _PATH_RE.search(message)
    path = path_match.group("path") if path_match else "$"
    missing = _MISSING_RE.match(message)
    if missing:
        return f"{path}.{missing.group('name')}"
    return path if path_match else None


def decode_json(data: bytes | str, type_: type[T]) -> T:
    """Decode JSON into a wire type; any failure is a WireDecodeError naming the field.

    The field is a JSON path such as `$.blobs[3].vector_clock` (None when the
    document itself is not JSON).
    """
    try:
        return msgspec.json.decode(data, type=type_)
    except msgspec.ValidationError as exc:
        message = str(exc)
        field = _field_of(message)
        raise WireDecodeError(f"invalid {type_.__name__}: {message}", field) from None
    except msgspec.DecodeError as exc:
        raise WireDecodeError(f"malformed JSON: {exc}", None) from None
    except UnicodeDecodeError:
        raise WireDecodeError("malformed JSON: not UTF-8 text", None) from None


def convert(obj: Any, type_: type[T]) -> T:
    """Convert already-parsed builtins (e.g. query parameters) into a wire type."""
    try:
        return msgspec.convert(obj, type=type_, strict=False)
    except msgspec.ValidationError as exc:
        message = str(exc)
        raise WireDecodeError(f"invalid {type_.__name__}: {message}", _field_of(message)) from None


def encode_json(obj: Any) -> bytes:
    """Encode a wire type (or builtins) as compact JSON."""
    return msgspec.json.encode(obj)
