"""Every error the relay answers is JSON (PROTOCOL §5): `{"error": "...", "code": "..."}`.

Framework errors (bad JSON, validation, 404, 405, 413) and database outages are
mapped here too, so no bad input ever gets a bare text body or a 500.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Final

import asyncpg
from litestar import Request, Response
from litestar.exceptions import (
    HTTPException,
    InternalServerException,
    MethodNotAllowedException,
    NotFoundException,
    ValidationException,
)
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from engram_sync.relay.domain.domain_errors import (
    AlreadyRetiredError,
    BatchTooLargeError,
    BusyError,
    EmptyBatchError,
    InvalidBlobError,
    QuotaExceededError,
    ResyncRequiredError,
    ScanTimeoutError,
    ShuttingDownError,
    VaultRetiredError,
)
from engram_sync.relay.domain.grant_roles import RoleRefusedError
from engram_sync.relay.domain.idempotency_keys import (
    HEADER as IDEMPOTENCY_HEADER,
)
from engram_sync.relay.domain.idempotency_keys import (
    IdempotencyKeyReusedError,
    InvalidIdempotencyKeyError,
    SealedAnswerError,
)
from engram_sync.relay.domain.stream_holders import REFUSED_RETRY_AFTER_S, StreamCapError
from engram_sync.relay.store.devices import DeviceQuotaError, LabelLockedError
from engram_sync.relay.store.handoff import TooManyRequestsError
from engram_sync.relay.store.owners import VaultOwnedError

log = logging.getLogger(__name__)

DB_RETRY_AFTER_SECS: Final = 2
SHUTDOWN_RETRY_AFTER_SECS: Final = (
    1  # a push its stopping lane never ran (relay.services.push_groups)
)


class RelayError(Exception):
    """An error with an HTTP status, a snake_case code and a message a person can act on."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.body = body
        self.extra = extra or {}

    def to_body(self) -> dict[str, Any]:
        """The JSON body: the exact override if any, else error + code (+ additive detail)."""
        if self.body is not None:
            return self.body
        return {"error": self.message, "code": self.code, **self.extra}


def unauthorized(message: str = "missing or unknown API key") -> RelayError:
    """401: no key, unknown key or revoked key."""
    return RelayError(
        401,
        "unauthorized",
        f"{message}: send `Authorization: Bearer <key>` with a valid key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def forbidden(message: str, code: str = "forbidden") -> RelayError:
    """403: the key is valid but not for this vault, route or device."""
    return RelayError(403, code, message)


def bad_request(message: str, code: str = "bad_request", **extra: Any) -> RelayError:
    """400 with a message naming the problem."""
    return RelayError(400, code, message, extra=extra)


def busy(message: str, retry_after_s: int) -> RelayError:
    """503 `busy` with Retry-After: refused at a per-process cap before any work was done,
    so a device may send the request again as it was (the client's `NOT_PROCESSED`)."""
    return RelayError(503, "busy", message, headers={"Retry-After": str(retry_after_s)})


def quota_exceeded(detail: str, limit: int, used: int) -> RelayError:
    """402 with the exact body of PROTOCOL §5 (`used` is the projected value)."""
    return RelayError(
        402,
        "quota_exceeded",
        f"quota exceeded: {detail}",
        body={"error": {"code": "quota_exceeded", "detail": detail, "limit": limit, "used": used}},
    )


# --- the store's domain exceptions, answered here and only here (STYLE: one owner) ---------


def _device_quota(_: Request[Any, Any, Any], exc: DeviceQuotaError) -> Response[Any]:
    return _relay_error(_, quota_exceeded(exc.detail, exc.limit, exc.used))


def _push_quota(_: Request[Any, Any, Any], exc: QuotaExceededError) -> Response[Any]:
    return _relay_error(_, quota_exceeded(exc.detail, exc.limit, exc.used))


def _empty_batch(_: Request[Any, Any, Any], exc: EmptyBatchError) -> Response[Any]:
    # PROTOCOL §5: 1 to 1000 blobs a push.
    return _relay_error(
        _, bad_request(f"empty batch: send 1 to {exc.max_blobs} blobs", code="empty_batch")
    )


def _batch_too_large(_: Request[Any, Any, Any], exc: BatchTooLargeError) -> Response[Any]:
    return _relay_error(
        _,
        bad_request(
            f"{exc.count} blobs in one push; at most {exc.max_blobs}", code="batch_too_large"
        ),
    )


def _invalid_blob(_: Request[Any, Any, Any], exc: InvalidBlobError) -> Response[Any]:
    # PROTOCOL §6 step 1: the index and reason; `field` is additive, the JSON path of the
    # value at fault in the push body.
    return _relay_error(
        _,
        bad_request(
            f"blob {exc.index}: {exc.reason}; nothing was written",
            code="invalid_blob",
            index=exc.index,
            reason=exc.reason,
            field=f"blobs[{exc.index}].{exc.field}",
        ),
    )


def _resync_required(_: Request[Any, Any, Any], exc: ResyncRequiredError) -> Response[Any]:
    # PROTOCOL §9, §12: a cursor behind the compaction horizon.
    message = (
        f"cursor {exc.cursor} is behind the compaction horizon {exc.horizon}: "
        "pull again from cursor 0 and reconcile"
    )
    return _relay_error(
        _, RelayError(409, "resync_required", message, extra={"horizon": exc.horizon})
    )


def answer_of_busy(exc: BusyError | ScanTimeoutError) -> RelayError:
    """A per-process cap's refusal (relay.services.scan_gate, relay.services.passwords) as
    its 503: `busy`, or `scan_timeout` for a scan the database stopped; both with
    Retry-After."""
    if isinstance(exc, ScanTimeoutError):
        return RelayError(
            503, "scan_timeout", exc.message, headers={"Retry-After": str(exc.retry_after_s)}
        )
    return busy(exc.message, exc.retry_after_s)


def _busy(_: Request[Any, Any, Any], exc: BusyError | ScanTimeoutError) -> Response[Any]:
    return _relay_error(_, answer_of_busy(exc))


def _shutting_down(_: Request[Any, Any, Any], exc: ShuttingDownError) -> Response[Any]:
    return _relay_error(
        _,
        RelayError(
            503,
            "unavailable",
            "the relay is shutting down; retry",
            headers={"Retry-After": str(SHUTDOWN_RETRY_AFTER_SECS)},
        ),
    )


def _vault_retired(_: Request[Any, Any, Any], exc: VaultRetiredError) -> Response[Any]:
    # PROTOCOL §19: `successor` is a hint (null when the retire named none).
    where = f"its successor is {exc.successor}" if exc.successor else "it named no successor"
    message = (
        f"vault {exc.vault_id} was retired ({where}); it takes no more writes: "
        "re-key or link this device to the successor"
    )
    extra: dict[str, Any] = {"successor": exc.successor}
    if exc.statement is not None and exc.stated_at is not None:  # §19 successor statement
        extra.update(statement=exc.statement, stated_at=exc.stated_at)
    return _relay_error(_, RelayError(410, "vault_retired", message, extra=extra))


def _already_retired(_: Request[Any, Any, Any], exc: AlreadyRetiredError) -> Response[Any]:
    # PROTOCOL §19: a retire is idempotent only with the successor it stored.
    message = (
        f"vault {exc.vault_id} was already retired with another successor; "
        "the stored one is in `successor`"
    )
    return _relay_error(
        _, RelayError(409, "already_retired", message, extra={"successor": exc.successor})
    )


def _label_locked(_: Request[Any, Any, Any], exc: LabelLockedError) -> Response[Any]:
    return _relay_error(
        _,
        forbidden(
            f"device {exc} already has another label; only a key bound to that device or "
            "an admin key of the vault may change it",
            code="label_locked",
        ),
    )


def _invalid_idempotency_key(
    _: Request[Any, Any, Any], exc: InvalidIdempotencyKeyError
) -> Response[Any]:
    return _relay_error(_, bad_request(str(exc), code="invalid_request", field=IDEMPOTENCY_HEADER))


def _idempotency_key_reused(
    _: Request[Any, Any, Any], exc: IdempotencyKeyReusedError | SealedAnswerError
) -> Response[Any]:
    # docs/retries.md: one key, one request; a different body under it is the client's bug.
    return _relay_error(_, RelayError(422, "idempotency_key_reused", str(exc)))


def _role_refused(_: Request[Any, Any, Any], exc: RoleRefusedError) -> Response[Any]:
    # PROTOCOL §13 "Grants carry a role": `admin_not_granted` or `owner_only`.
    return _relay_error(_, forbidden(exc.message, code=exc.code))


def _vault_owned(_: Request[Any, Any, Any], exc: VaultOwnedError) -> Response[Any]:
    # PROTOCOL §13: one answer whether the operator or another account owns the id.
    return _relay_error(
        _,
        forbidden(
            f"vault {exc.vault_id} is already in use on this relay; ask an admin of it to "
            f"grant this account (POST /v1/vaults/{exc.vault_id}/grants), or choose another "
            "vault id",
            code="vault_owned",
        ),
    )


def _too_many_handoffs(_: Request[Any, Any, Any], exc: TooManyRequestsError) -> Response[Any]:
    # PROTOCOL §14: the limit is per requesting key; the vault's is only a safety net.
    if exc.scope == "key":
        message = (
            f"this key already has {exc.limit} open handoff requests in this vault; "
            "claim or cancel them, or wait for them to expire"
        )
    else:
        message = (
            f"this vault already has {exc.limit} open handoff requests; "
            "wait for them to be claimed or to expire"
        )
    return _relay_error(_, RelayError(409, "too_many_handoffs", message))


def _too_many_streams(_: Request[Any, Any, Any], exc: StreamCapError) -> Response[Any]:
    # PROTOCOL §15, per process (relay.domain.stream_holders): only the address cap refuses; a
    # key or account at its cap ends its own oldest stream instead.
    message = (
        f"this client address holds {exc.limit} event streams and long-polls on this relay "
        f"process ({exc.env}); close one, or retry later"
    )
    error = RelayError(
        429,
        "too_many_streams",
        message,
        headers={"Retry-After": str(REFUSED_RETRY_AFTER_S)},
        extra={"cap": exc.env, "limit": exc.limit},
    )
    return _relay_error(_, error)


def _json(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Response[Any]:
    return Response(
        content=body, status_code=status, headers=headers, media_type="application/json"
    )


def _relay_error(_: Request[Any, Any, Any], exc: RelayError) -> Response[Any]:
    return _json(exc.status, exc.to_body(), exc.headers)


_MISSING_FIELD: Final = re.compile(r"Object missing required field `([^`]*)`")


def _validation_error(_: Request[Any, Any, Any], exc: ValidationException) -> Response[Any]:
    problems = exc.extra if isinstance(exc.extra, list) else []
    first = problems[0] if problems and isinstance(problems[0], dict) else {}
    field = first.get("key")
    message = first.get("message") or str(exc.detail)
    missing = _MISSING_FIELD.match(message)
    if missing:
        field = f"{field}.{missing.group(1)}" if field else missing.group(1)
    where = f" at `{field}`" if field else ""
    return _json(
        400,
        {
            "error": f"invalid request: {message}{where}",
            "code": "invalid_request",
            "field": field,
        },
    )


_HTTP_CODES: Final = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
}


# What litestar raises (an InternalServerException) when the connection closes before the
# body is complete: the client left, or relay.serving.connections closed it after the body timeout
# (and answered it 408 itself). Not a server fault, so not a logged 500.
_BODY_CUT_SHORT: Final = "client disconnected prematurely"


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    status = exc.status_code
    if isinstance(exc, InternalServerException) and exc.detail == _BODY_CUT_SHORT:
        log.info(
            "client disconnected (or hit the body timeout) before its request body was "
            "complete: %s %s",
            request.method,
            request.url.path,
        )
        message = "the connection closed before the request body was complete"
        return _json(408, {"error": message, "code": "body_timeout"})
    if status >= HTTP_500_INTERNAL_SERVER_ERROR:
        return _internal_error(request, exc)
    code = _HTTP_CODES.get(status, "client_error")
    message = str(exc.detail)
    if isinstance(exc, NotFoundException):
        message = f"no route {request.method} {request.url.path}"
    elif isinstance(exc, MethodNotAllowedException):
        message = f"method {request.method} is not allowed on {request.url.path}"
    elif status == 413:
        message = "request body is larger than this relay accepts (see GET /v1/info)"
    elif status == 400 and ("JSON" in message or "truncated" in message):
        code, message = "malformed_json", f"request body is not valid JSON: {message}"
    return _json(status, {"error": message, "code": code}, dict(exc.headers or {}))


def _database_unavailable(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.warning("database unavailable: %s", type(exc).__name__)
    return _json(
        503,
        {"error": "the relay's database is unavailable; retry shortly", "code": "unavailable"},
        {"Retry-After": str(DB_RETRY_AFTER_SECS)},
    )


def _internal_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    if isinstance(exc, OSError | asyncpg.PostgresConnectionError | asyncpg.InterfaceError):
        return _database_unavailable(request, exc)
    if isinstance(exc, asyncpg.CannotConnectNowError | asyncpg.ConnectionDoesNotExistError):
        return _database_unavailable(request, exc)
    if isinstance(exc, asyncpg.DataError):
        # A value the database cannot store (e.g. an encoding problem) is bad input, not
        # a server fault; the handlers validate first, this is the net under them.
        log.warning("rejected a value the database cannot store: %s", type(exc).__name__)
        return _json(
            400, {"error": "a value in the request cannot be stored", "code": "bad_request"}
        )
    log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return _json(500, {"error": "internal error; the relay logged it", "code": "internal_error"})


EXCEPTION_HANDLERS: Final = {
    RelayError: _relay_error,
    # relay.domain.domain_errors: the push and pull refusals of the rules and store layers.
    EmptyBatchError: _empty_batch,
    BatchTooLargeError: _batch_too_large,
    InvalidBlobError: _invalid_blob,
    QuotaExceededError: _push_quota,
    ResyncRequiredError: _resync_required,
    ShuttingDownError: _shutting_down,
    BusyError: _busy,
    ScanTimeoutError: _busy,
    VaultRetiredError: _vault_retired,  # PROTOCOL §19
    AlreadyRetiredError: _already_retired,
    DeviceQuotaError: _device_quota,
    LabelLockedError: _label_locked,
    TooManyRequestsError: _too_many_handoffs,
    StreamCapError: _too_many_streams,  # PROTOCOL §15
    VaultOwnedError: _vault_owned,
    RoleRefusedError: _role_refused,
    InvalidIdempotencyKeyError: _invalid_idempotency_key,
    IdempotencyKeyReusedError: _idempotency_key_reused,
    SealedAnswerError: _idempotency_key_reused,
    ValidationException: _validation_error,
    HTTPException: _http_error,
    Exception: _internal_error,
}
