"""Typed errors of the device side; every message is one line a person can act on.

No message or repr ever holds an API key (at most its first characters).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from engram_sync.shared_format.ids import check_id

BODY_EXCERPT_CHARS: Final = 200


class SyncError(Exception):
    """Base class of every error the Engram Sync client raises."""


class RelayError(SyncError):
    """The relay answered a request with an error status (PROTOCOL §5)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} (HTTP {self.status}, {self.code})"

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(status={self.status}, code={self.code!r}, message={self.message!r})"


class AuthError(RelayError):
    """401: the API key is missing, unknown or revoked."""


class ForbiddenError(RelayError):
    """403: the key is valid but not for this vault, route or device."""


class DeviceRevokedError(ForbiddenError):
    """403 `device_revoked`: this device (and every key bound to it) was revoked (§10)."""


class VaultRetiredError(RelayError):
    """410 `vault_retired`: the vault was re-keyed and retired (PROTOCOL §19); pushes to it are
    refused from then on. `successor` is the relay's hint of the vault that replaced it (None
    when it named none, or named something that is not a vault id): only a hint, the device
    switches to it only with a key it obtained itself (client._sync.retirement), and only
    once `statement` (with `stated_at`, the successor statement of §19's last bullet)
    verifies under the old vault's hmac key (client._flows.successor)."""

    def __init__(
        self,
        message: str,
        *,
        successor: str | None = None,
        statement: str | None = None,
        stated_at: str | None = None,
    ) -> None:
        super().__init__(410, "vault_retired", message)
        self.successor = successor
        self.statement = statement
        self.stated_at = stated_at


class QuotaExceededError(RelayError):
    """402: the push would exceed the vault's quota; nothing of the batch was written."""

    def __init__(self, message: str, *, detail: str, limit: int, used: int) -> None:
        super().__init__(402, "quota_exceeded", message)
        self.detail = detail
        self.limit = limit
        self.used = used


class ResyncRequiredError(RelayError):
    """409 `resync_required`: the cursor is behind the compaction horizon (§9, §12)."""

    def __init__(self, message: str, *, horizon: int | None = None) -> None:
        super().__init__(409, "resync_required", message)
        self.horizon = horizon


class InvalidBlobError(RelayError):
    """400 `invalid_blob`: the relay refused a whole push for one structurally invalid blob
    (PROTOCOL §6 step 1), nothing written; `index` is that blob's place in the batch (None
    when the answer did not say), `reason` the relay's words."""

    def __init__(self, message: str, *, index: int | None, reason: str) -> None:
        super().__init__(400, "invalid_blob", message)
        self.index = index
        self.reason = reason


class RateLimitedError(RelayError):
    """429 that persisted after every retry; `retry_after` is the relay's last hint."""

    def __init__(self, code: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(429, code, message)
        self.retry_after = retry_after


class RelayUnavailableError(SyncError):
    """The relay could not be reached, or kept answering 5xx, after every retry.

    `status` is the last 5xx status, or None when no answer arrived at all.
    """

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status


class OutcomeUnknownError(RelayUnavailableError):
    """A call that must not be repeated lost its answer after it may have reached the relay
    (docs/retries.md): the action may have happened; the message says how to check."""


class ProtocolError(SyncError):
    """A success answer whose body is not what the protocol promises."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class AnswerTooLargeError(ProtocolError):
    """An answer passed the size the client accepts for it; it was dropped unread."""

    def __init__(self, message: str, *, max_bytes: int) -> None:
        super().__init__(message)
        self.max_bytes = max_bytes


class RelayMisbehavedError(ProtocolError):
    """A well-formed answer that no honest relay gives (a cursor that goes back or jumps,
    a page that makes no progress): refused, nothing of it applied (issue 13)."""


class FeedUnavailableError(ProtocolError):
    """The live change feed (PROTOCOL §15) answered with something that is not an event
    stream (a proxy in the way): the device falls back to the long-poll or to polling."""


def one_line(text: str) -> str:
    """Collapse all whitespace (newlines included) into single spaces."""
    return " ".join(text.split())


def body_excerpt(body: bytes) -> str:
    """The first 200 characters of a body, as one line of text."""
    text = body.decode("utf-8", "replace")[:BODY_EXCERPT_CHARS]
    return one_line(text) or "<empty body>"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_QUOTA_HINTS: Final = {
    "bytes": "delete memories or ask the relay's operator for a larger quota",
    "devices": "revoke an unused device or ask the relay's operator for a larger quota",
}


def _quota_error(inner: dict[str, Any]) -> QuotaExceededError:
    detail = str(inner.get("detail", "unknown"))
    limit, used = _int(inner.get("limit")), _int(inner.get("used"))
    hint = _QUOTA_HINTS.get(detail, "ask the relay's operator for a larger quota")
    message = (
        f"quota exceeded: {detail} (used {used} of {limit}); nothing in this batch was "
        f"written — {hint}"
    )
    return QuotaExceededError(one_line(message), detail=detail, limit=limit or 0, used=used or 0)


def vault_id_hint(value: Any) -> str | None:
    """A vault id a relay named (a successor, PROTOCOL §19) if it could be one: text the
    id rule of §6 step 1 accepts (shared_format.ids); None for anything else."""
    if not isinstance(value, str) or check_id(value, "vault id") is not None:
        return None
    return value


MAX_STATEMENT_CHARS: Final = 128  # PROTOCOL §19: base64 of a 32-byte MAC is 44


def statement_hint(value: Any) -> str | None:
    """A successor statement or its `stated_at` as a relay sent it (PROTOCOL §19), if it
    is short text; None for anything else. Only checked for validity by the follower."""
    if not isinstance(value, str) or not value or len(value) > MAX_STATEMENT_CHARS:
        return None
    return value


def _parsed(body: bytes) -> dict[str, Any] | None:
    try:
        value = msgspec.json.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def relay_error(status: int, body: bytes, *, retry_after: float | None = None) -> RelayError:
    """The typed error for an error answer: status and the JSON `{"error","code"}` body.

    A body that is not the relay's JSON error shape gives a message with the
    status and the first 200 characters of the body.
    """
    said = _parsed(body) or {}
    error = said.get("error")
    if status == 402 and isinstance(error, dict):
        return _quota_error(error)
    if isinstance(error, str) and error.strip():
        message = one_line(error)
        code_value = said.get("code")
        code = code_value if isinstance(code_value, str) and code_value else f"http_{status}"
    else:
        message, code = f"the relay answered HTTP {status}: {body_excerpt(body)}", f"http_{status}"
    build = _BY_STATUS_AND_CODE.get((status, code)) or _BY_STATUS.get(status)
    if status == 429:
        return RateLimitedError(code, message, retry_after=retry_after)
    return build(status, code, message, said) if build else RelayError(status, code, message)


def _forbidden(status: int, code: str, message: str, said: dict[str, Any]) -> RelayError:
    cls = DeviceRevokedError if code == "device_revoked" else ForbiddenError
    return cls(status, code, message)


def _resync(status: int, code: str, message: str, said: dict[str, Any]) -> RelayError:
    return ResyncRequiredError(message, horizon=_int(said.get("horizon")))


def _invalid_blob(status: int, code: str, message: str, said: dict[str, Any]) -> RelayError:
    reason = said.get("reason")
    return InvalidBlobError(
        message,
        index=_int(said.get("index")),
        reason=one_line(reason)[:BODY_EXCERPT_CHARS] if isinstance(reason, str) else message,
    )


def _retired(status: int, code: str, message: str, said: dict[str, Any]) -> RelayError:
    return VaultRetiredError(
        message,
        successor=vault_id_hint(said.get("successor")),
        statement=statement_hint(said.get("statement")),  # PROTOCOL §19
        stated_at=statement_hint(said.get("stated_at")),
    )


_Build = Callable[[int, str, str, dict[str, Any]], RelayError]

#: The error type of an answer, by its status alone (429 is built in relay_error: it needs
#: the Retry-After header).
_BY_STATUS: dict[int, _Build] = {
    401: lambda status, code, message, said: AuthError(status, code, message),
    403: _forbidden,
    402: lambda status, code, message, said: QuotaExceededError(
        message, detail="unknown", limit=0, used=0
    ),
}

#: The error type of an answer by its status and code, before _BY_STATUS.
_BY_STATUS_AND_CODE: dict[tuple[int, str], _Build] = {
    (409, "resync_required"): _resync,
    (400, "invalid_blob"): _invalid_blob,
    (410, "vault_retired"): _retired,
}
