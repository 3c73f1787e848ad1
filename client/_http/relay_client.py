"""A synchronous client of the relay HTTP API (PROTOCOL §5-§12), on httpx.

Every method returns the wire Struct of its route. Each call names its retry
policy (:class:`Retry`, docs/retries.md): a `SAFE` call is retried on connection
failures, timeouts, 5xx and 429 with exponential backoff and full jitter (honouring
`Retry-After`); a `NEVER_AFTER_SEND` call only while the relay provably did not act
on it. Other 4xx answers raise at once as typed errors (client._errors).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import random
import secrets
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import Final, TypeVar
from urllib.parse import quote

import httpx

from engram_sync import __version__
from engram_sync.shared_format.digest import (
    DigestAnswer,
    FetchRequest,
    FetchResponse,
    NarrowAnswer,
    NarrowRequest,
)
from engram_sync.shared_format.errors import WireDecodeError
from engram_sync.shared_format.wire import (
    DeviceRegistered,
    DeviceRevoked,
    DeviceRoster,
    PullResponse,
    PushRequest,
    PushResponse,
    RegisterDeviceRequest,
    RelayInfo,
    RetireRequest,
    RetireResponse,
    SyncBlob,
    SyncHealth,
    VaultStats,
    decode_json,
    encode_json,
)

from .._errors import (
    AnswerTooLargeError,
    FeedUnavailableError,
    OutcomeUnknownError,
    ProtocolError,
    RateLimitedError,
    RelayError,
    RelayUnavailableError,
    SyncError,
    body_excerpt,
    one_line,
    relay_error,
)

log = logging.getLogger(__name__)

USER_AGENT: Final = f"engram-sync/{__version__}"
DEVICE_HEADER: Final = "X-Engram-Device"
# docs/retries.md: a fresh key per call (22 characters of base64url), and the feature that
# says the relay honours it.
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
IDEMPOTENCY_KEY_BYTES: Final = 16
IDEMPOTENCY_FEATURE: Final = "idempotency-keys"
KEY_PREFIX_CHARS: Final = 6
_REDACTED: Final = b"<api key>"
# PROTOCOL §5, issue 13: every answer is read with a cap, so a relay cannot make the device
# hold an unbounded body in memory. Answers other than pull pages are small (the largest,
# a push answer, names at most 1000 rejected ids of <= 256 characters).
MAX_ANSWER_BYTES: Final = 4 * 1024 * 1024
# A pull page holds at most `max_pull_limit` blobs of up to `max_blob_bytes` each, which an
# honest relay can make large (1000 x 1 MiB); the syncer asks for fewer blobs when a page
# passes this cap (see Syncer.pull), and a single blob always fits.
PULL_PAGE_BUDGET_BYTES: Final = 32 * 1024 * 1024
_DIGEST_ASKED: Final[Mapping[str, str | int]] = {"digest": 1}  # `ask_digest`
# The whole answer must arrive within this many request timeouts: the per-read timeout
# alone lets a relay trickle a byte every few seconds forever.
ANSWER_DEADLINE_TIMEOUTS: Final = 4
# The body of an error answer to the event stream (PROTOCOL §15) is read up to this much.
MAX_ERROR_BYTES: Final = 64 * 1024

# An idle connection is dropped by the client before the relay drops it (the relay closes
# keep-alive connections idle for 5 s: relay.serving.KEEP_ALIVE_S). With both at 5 s, a
# request sent on a connection the server was closing that moment got "connection reset":
# 1 in 200 requests made after 4.97-5.03 s idle, in a reproduction.
KEEPALIVE_EXPIRY_S: Final = 4.0

# issue 17: how long a client that has not reached the relay yet tries to connect (each
# attempt's connect timeout, and the budget of its retries), so a wrong relay URL fails in a
# few seconds with one line. Once the relay answered, a refused connection (a restart) is
# retried on the usual schedule. docs/cli.md: ENGRAM_CONNECT_TIMEOUT.
CONNECT_TIMEOUT_ENV: Final = "ENGRAM_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT_S: Final = 5.0
_CONNECT_FAILURES: Final = (httpx.ConnectError, httpx.ConnectTimeout)

T = TypeVar("T")


def connect_timeout_from_env() -> float:
    """ENGRAM_CONNECT_TIMEOUT in seconds (default 5); ValueError naming it when it is not a
    number in (0, 600]."""
    raw = os.environ.get(CONNECT_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_CONNECT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (0 < value <= 600):
        raise ValueError(
            f"{CONNECT_TIMEOUT_ENV}={raw!r} is not a number of seconds in (0, 600], e.g. 5"
        )
    return value


@dataclass
class _RelayFacts:
    """What a client learned of its relay once: the /v1/info answer."""

    info: RelayInfo | None = None


class Retry(Enum):
    """How a call is retried; every call names one (docs/retries.md)."""

    # Repeating the request does no harm (GET, PUT of the same body, DELETE, a push:
    # PROTOCOL §6, an equal clock is stale): retried on any transport error, 5xx and 429.
    SAFE = "safe"
    # A repeat could act twice (mint a second key, a second code or request): retried only
    # while the relay provably did not act (NOT_SENT errors, 429, NOT_PROCESSED 503s);
    # any other failure raises OutcomeUnknownError, which says how to check.
    NEVER_AFTER_SEND = "never_after_send"
    # A call that creates something, sent with an `Idempotency-Key` (one per call, the same
    # on every attempt): retried as SAFE when the relay lists `idempotency-keys` in
    # /v1/info (a repeat then answers what the first attempt made), else NEVER_AFTER_SEND.
    IDEMPOTENT = "idempotent"


# Transport errors raised before any byte of the request left this machine.
NOT_SENT: Final = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# 503 codes the relay answers before it reads the request (relay.connections: a connection
# refused at the cap) or before it does anything with it (relay.services.passwords: the hashing
# queue is full). 429 is answered by the rate limiter before the route runs (relay.auth).
# A 503 `unavailable` (the database failed) may follow a commit whose answer was lost.
NOT_PROCESSED: Final = frozenset({"busy", "overloaded"})


def path_segment(value: str) -> str:
    """`value` escaped as one URL path segment (`/`, `?`, `#` and dot segments too)."""
    escaped = quote(value, safe="")
    if escaped in {".", ".."}:
        return escaped.replace(".", "%2E")
    return escaped


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """The `Retry-After` header in seconds, or None when absent or not a number."""
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw.strip())
    except ValueError:
        return None  # an HTTP-date: fall back to our own backoff
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


class RelayClient:
    """A synchronous relay client; use it as a context manager or call `close()`.

    `max_retries` is the number of retries after the first attempt, so a request
    is sent at most `max_retries + 1` times. The delay before retry n (from 0) is
    uniform in [0, min(backoff_max, backoff_base * 2**n)] ("full jitter"), or the
    relay's `Retry-After` capped at `backoff_max` when it sends one. `sleep` and
    `rng` are injectable for tests.
    """

    # long: its keyword parameters (every bound and policy, injectable for tests) are its
    #   signature; the body checks the URL and sets them
    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        device_id: str | None = None,
        timeout: float = 30.0,
        connect_timeout: float | None = None,
        max_retries: int = 5,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        try:
            url = httpx.URL(base_url.strip().rstrip("/"))
        except httpx.InvalidURL as exc:
            raise ValueError(f"relay URL is not a valid URL: {exc}") from None
        if url.scheme not in {"http", "https"} or not url.host:
            raise ValueError(
                f"relay URL {_display_url(url)!r} is not an http(s) URL with a host, "
                "e.g. https://relay.example.com"
            )
        if max_retries < 0 or backoff_base < 0 or backoff_max < 0 or timeout <= 0:
            raise ValueError("max_retries, backoff_base and backoff_max must be >= 0, timeout > 0")
        if device_id is not None and not _header_safe(device_id):
            raise ValueError("device_id must be printable ASCII (it is sent in a header)")
        api_key = api_key.strip() if api_key else None
        if api_key and not _header_safe(api_key):
            raise ValueError(
                "the API key contains characters that cannot be sent in a header; "
                "check it for stray spaces, quotes or line breaks"
            )
        self.base_url = _display_url(url)
        self.device_id = device_id
        self.timeout = timeout
        wait = connect_timeout if connect_timeout is not None else connect_timeout_from_env()
        self.connect_timeout = min(wait, timeout)
        self._reached = False  # any answer of the relay so far (see CONNECT_TIMEOUT_ENV)
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        # /v1/info, asked once per client and shared with its `with_retries` copies (issue
        # 36: once per vault session, client._session.VaultSession.shared_relay)
        self._facts = _RelayFacts()
        # ours (feature `digest-carried`, docs/digest.md): pushes and cursor pulls ask for
        # the vault's §18 digest in their answers (`?digest=1`); set by the syncer
        self.ask_digest = False
        self._key_bytes = api_key.encode("utf-8") if api_key else None
        self._key_prefix = api_key[:KEY_PREFIX_CHARS] if api_key else None
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()  # noqa: S311 (jitter, not crypto)
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        if device_id is not None:
            headers[DEVICE_HEADER] = device_id
        self._http = httpx.Client(
            base_url=url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=self.connect_timeout),
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S),
            transport=transport,
            follow_redirects=False,
        )

    def __repr__(self) -> str:
        key = f"{self._key_prefix}…" if self._key_prefix else None
        return (
            f"RelayClient(base_url={self.base_url!r}, api_key={key!r}, "
            f"device_id={self.device_id!r})"
        )

    def __enter__(self) -> RelayClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the underlying connection pool."""
        self._http.close()

    def with_retries(self, max_retries: int) -> RelayClient:
        """This client with another retry budget: the same connection pool and the same
        /v1/info answer (issue 36). Close only the original."""
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        other = copy.copy(self)
        other.max_retries = max_retries
        return other

    # -- routes -----------------------------------------------------------------

    def info(self) -> RelayInfo:
        """`GET /v1/info`: the relay's limits advertisement (§11)."""
        return self._call("GET", "/v1/info", RelayInfo, retry=Retry.SAFE)

    def known_info(self) -> RelayInfo:
        """`/v1/info`, asked once per client (and its copies); SyncError when it cannot be
        asked (asked again next time)."""
        if self._facts.info is None:
            self._facts.info = self.info()
        return self._facts.info

    def health(self) -> SyncHealth:
        """`GET /health`: liveness and compatible counters (§5)."""
        return self._call("GET", "/health", SyncHealth, retry=Retry.SAFE)

    def ready(self) -> bool:
        """`GET /ready`, one attempt: True when the relay and its database answer.

        False for a 5xx (the relay's database is down, or a proxy cannot reach
        the relay) and when nothing answers at all; any other error status raises.
        """
        try:
            response = self._request("GET", "/ready", None, None, None, MAX_ANSWER_BYTES)
        except httpx.TransportError as exc:
            log.debug("relay at %s is not ready: %s", self.base_url, type(exc).__name__)
            return False
        if response.status_code >= 500:
            return False
        if response.is_success:
            return True
        raise self._error(response)

    def push(self, vault_id: str, blobs: list[SyncBlob]) -> PushResponse:
        """`POST /v1/vaults/{vault_id}/push` with 1..1000 blobs (§5, §6).

        Retry.SAFE (PROTOCOL §6): the relay treats an equal clock as stale, so when a
        first attempt committed but its answer was lost, the retry answers with those
        memory ids in `rejected` (and `accepted` 0 for them). The syncer handles that
        like any rejection: pull, then see its own version come back.
        """
        body = encode_json(PushRequest(blobs=blobs))
        path = f"{_vault(vault_id)}/push"
        params = _DIGEST_ASKED if self.ask_digest else None  # `vault_digest` after the commit
        return self._call("POST", path, PushResponse, retry=Retry.SAFE, params=params, content=body)

    def pull(
        self,
        vault_id: str,
        *,
        cursor: int | None = None,
        since: str | None = None,
        limit: int | None = None,
        max_bytes: int = PULL_PAGE_BUDGET_BYTES,
        origin: int | None = None,
        wait: int | None = None,
    ) -> PullResponse:
        """`GET /v1/vaults/{vault_id}/pull`: cursor mode (§9) when `cursor` is given,
        else the legacy `since` mode (§7). A stale cursor raises ResyncRequiredError; a
        page longer than `max_bytes` raises AnswerTooLargeError (ask for fewer blobs).
        """
        params: dict[str, str | int] = {}
        if cursor is not None:
            params["cursor"] = cursor
        if since is not None:
            params["since"] = since
        if limit is not None:
            params["limit"] = limit
        if origin is not None:
            params["origin"] = origin  # the cursor this pull began at (docs/pull-origin.md)
        if wait is not None:
            params["wait"] = wait  # PROTOCOL §15 long-poll: held up to `wait` seconds
        if self.ask_digest and cursor is not None:
            params.update(_DIGEST_ASKED)  # a last page at the head: `vault_digest`
        path = f"{_vault(vault_id)}/pull"
        return self._call(
            "GET", path, PullResponse, retry=Retry.SAFE, params=params, max_bytes=max_bytes
        )

    @contextlib.contextmanager
    def events(self, vault_id: str, *, cursor: int, blobs: bool = False) -> Iterator[EventStream]:
        """`GET /v1/vaults/{vault_id}/events?cursor=N` (PROTOCOL §15), one attempt: the
        stream's raw bytes as they arrive (client._http.sse parses them), closed on exit.
        `blobs`: ask for small commits' blobs in the change events (`blobs=1`, ours).

        Read with the client's timeout between bytes (longer than the relay's 15 s ping).
        An error answer raises its typed error (5xx and 429: RelayUnavailableError and
        RateLimitedError); a 200 that is not an uncompressed `text/event-stream` raises
        FeedUnavailableError (a proxy answering in its place, or buffering it).
        """
        path = f"{_vault(vault_id)}/events"
        request = self._http.build_request(
            "GET",
            path,
            params={"cursor": cursor, "blobs": 1} if blobs else {"cursor": cursor},
            headers={
                "Accept": "text/event-stream",
                "Accept-Encoding": "identity",
                "Cache-Control": "no-cache",
            },
        )
        try:
            response = self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise self._unreachable(exc, 1) from exc
        try:
            if not response.is_success:
                answer = _capped_answer(response, request, MAX_ERROR_BYTES)
                if answer.status_code == 429 or answer.status_code >= 500:
                    raise self._gave_up(answer, 1)
                raise self._error(answer)
            kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            if kind != "text/event-stream" or encoding not in ("", "identity"):
                raise FeedUnavailableError(
                    one_line(
                        f"the relay at {self.base_url} answered GET {path} with "
                        f"{kind or 'no content type'} ({encoding}), not an event stream"
                    )
                )
            yield EventStream(response)
        finally:
            response.close()

    def stats(self, vault_id: str) -> VaultStats:
        """`GET /v1/vaults/{vault_id}/stats`: live blob count and newest created_at."""
        return self._call("GET", f"{_vault(vault_id)}/stats", VaultStats, retry=Retry.SAFE)

    def devices(self, vault_id: str) -> DeviceRoster:
        """`GET /v1/vaults/{vault_id}/devices`: the roster, newest first."""
        return self._call("GET", f"{_vault(vault_id)}/devices", DeviceRoster, retry=Retry.SAFE)

    def register_device(self, vault_id: str, device_id: str, label: str) -> DeviceRegistered:
        """`POST /v1/vaults/{vault_id}/devices/register`: label a device (idempotent)."""
        body = encode_json(RegisterDeviceRequest(device_id=device_id, label=label))
        path = f"{_vault(vault_id)}/devices/register"
        return self._call("POST", path, DeviceRegistered, retry=Retry.SAFE, content=body)

    def revoke_device(self, vault_id: str, device_id: str) -> DeviceRevoked:
        """`DELETE /v1/vaults/{vault_id}/devices/{device_id}`: admin key; idempotent."""
        path = f"{_vault(vault_id)}/devices/{path_segment(device_id)}"
        return self._call("DELETE", path, DeviceRevoked, retry=Retry.SAFE)

    # PROTOCOL §18 (docs/digest.md) -------------------------------------------------

    def offers(self, feature: str) -> bool:
        """Whether the relay's /v1/info lists `feature` (asked once per client)."""
        return self._relay_offers(feature)

    def digest(
        self,
        vault_id: str,
        *,
        bucket: int | None = None,
        entries: bool = False,
        every_bucket: bool = False,
        after: str = "",
        deep: bool = False,
    ) -> DigestAnswer:
        """`GET /v1/vaults/{vault_id}/digest`: the vault's, one bucket's (`bucket`), one
        bucket's list a page at a time (`entries`, from `after`), or every bucket's."""
        params: dict[str, str | int] = {}
        if bucket is not None:
            params["bucket"] = bucket
        if entries:
            params["list"] = 1
            if after:
                params["after"] = after
        if every_bucket:
            params["buckets"] = 1
        if deep:  # ours (feature `digest-deep`): computed from the relay's rows
            params["deep"] = 1
        path = f"{_vault(vault_id)}/digest"
        return self._call("GET", path, DigestAnswer, retry=Retry.SAFE, params=params)

    def narrow(self, vault_id: str, request: NarrowRequest) -> NarrowAnswer:
        """`POST /v1/vaults/{vault_id}/digest/narrow` (ours): one bucket's sub-buckets that
        differ from the device's, and their versions a page at a time (a read)."""
        path = f"{_vault(vault_id)}/digest/narrow"
        return self._call(
            "POST", path, NarrowAnswer, retry=Retry.SAFE, content=encode_json(request)
        )

    def retire(
        self,
        vault_id: str,
        successor: str | None,
        *,
        statement: str | None = None,
        stated_at: str | None = None,
    ) -> RetireResponse:
        """`POST /v1/vaults/{vault_id}/retire` (PROTOCOL §19, admin): the relay answers a
        repeated identical retire with the same values, so the call is SAFE to repeat.
        `statement`/`stated_at`: the successor statement (§19 last bullet), sent if given."""
        said = {} if statement is None else {"statement": statement, "stated_at": stated_at}
        body = encode_json(RetireRequest(successor=successor, **said))
        path = f"{_vault(vault_id)}/retire"
        return self._call("POST", path, RetireResponse, retry=Retry.SAFE, content=body)

    def fetch(
        self, vault_id: str, memory_ids: list[str], *, max_bytes: int = PULL_PAGE_BUDGET_BYTES
    ) -> FetchResponse:
        """`POST /v1/vaults/{vault_id}/fetch`: the current blobs of up to 1000 memories."""
        body = encode_json(FetchRequest(memory_ids=memory_ids))
        path = f"{_vault(vault_id)}/fetch"
        return self._call(
            "POST", path, FetchResponse, retry=Retry.SAFE, content=body, max_bytes=max_bytes
        )

    # -- machinery --------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        type_: type[T],
        *,
        retry: Retry,
        lost: str = "",
        params: Mapping[str, str | int] | None = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> T:
        """`lost` (required with NEVER_AFTER_SEND) tells the user what may have happened
        and how to check, when the answer is lost after the request may have arrived."""
        response = self._send(
            method,
            path,
            retry=retry,
            lost=lost,
            params=params,
            content=content,
            headers=headers,
            max_bytes=max_bytes,
        )
        try:
            return decode_json(response.content, type_)
        except WireDecodeError as exc:
            raise ProtocolError(
                one_line(
                    f"the relay at {self.base_url} answered {method} {path} with a body that "
                    f"is not a valid {type_.__name__} ({exc}); check that the URL points at "
                    "an Engram sync relay"
                ),
                field=exc.field,
            ) from None

    def _send(
        self,
        method: str,
        path: str,
        *,
        retry: Retry,
        lost: str = "",
        params: Mapping[str, str | int] | None,
        content: bytes | None,
        headers: Mapping[str, str] | None = None,
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> httpx.Response:
        """Send with retries as `retry` allows; a success response, or the typed error of
        the last answer (OutcomeUnknownError when a NEVER_AFTER_SEND call may have acted).

        `headers` are added to this request only (e.g. `X-Engram-Vault-Key`). The answer's
        body is read up to `max_bytes` (decoded) and within the answer deadline; past
        either the request fails (AnswerTooLargeError, or a timeout that is retried).
        """
        sent_headers, once_sent = self._prepared(method, path, retry, lost, headers, content)
        attempt = 0
        waited = 0.0  # backoff slept so far (the connect budget counts it, not the clock)
        while True:
            try:
                response = self._request(method, path, params, content, sent_headers, max_bytes)
            except httpx.TransportError as exc:
                if once_sent and not isinstance(exc, NOT_SENT):
                    raise self._outcome_unknown(method, path, type(exc).__name__, lost) from exc
                delay = self._after_transport_error(exc, attempt, waited)
                waited += delay
                log.info(
                    "relay %s %s failed (%s); retry %d in %.2fs",
                    method, path, type(exc).__name__, attempt + 1, delay,
                )  # fmt: skip
            except httpx.HTTPError as exc:  # e.g. an undecodable Content-Encoding
                raise ProtocolError(
                    one_line(f"the relay at {self.base_url} sent an unreadable answer: {exc}")
                ) from None
            else:
                self._reached = True
                if response.is_success:
                    return response
                status = response.status_code
                if status != 429 and status < 500:
                    raise self._error(response)
                if once_sent and not _not_processed(response):
                    raise self._outcome_unknown(method, path, f"HTTP {status}", lost)
                if attempt >= self.max_retries:
                    raise self._gave_up(response, attempt + 1)
                hint = _retry_after(response.headers)
                delay = min(hint, self.backoff_max) if hint is not None else self._backoff(attempt)
                log.info(
                    "relay %s %s answered %d; retry %d in %.2fs",
                    method, path, status, attempt + 1, delay,
                )  # fmt: skip
            self._sleep(delay)
            attempt += 1

    def _prepared(
        self,
        method: str,
        path: str,
        retry: Retry,
        lost: str,
        headers: Mapping[str, str] | None,
        content: bytes | None,
    ) -> tuple[dict[str, str] | None, bool]:
        """The request's own headers, and whether it may not be sent again once sent: an
        IDEMPOTENT call carries an idempotency key and is retried only where the relay
        honours it (else it is NEVER_AFTER_SEND)."""
        if retry is not Retry.SAFE and not lost:
            raise ValueError(f"{method} {path}: a {retry.name} call must say what `lost` means")
        extra = dict(headers or {})
        if retry is Retry.IDEMPOTENT:
            extra[IDEMPOTENCY_HEADER] = secrets.token_urlsafe(IDEMPOTENCY_KEY_BYTES)
            honoured = self._relay_offers(IDEMPOTENCY_FEATURE)
            retry = Retry.SAFE if honoured else Retry.NEVER_AFTER_SEND
        if content is not None:
            extra["Content-Type"] = "application/json"
        return extra or None, retry is Retry.NEVER_AFTER_SEND

    def _after_transport_error(
        self, exc: httpx.TransportError, attempt: int, waited: float
    ) -> float:
        """The wait before trying again after `exc`, or the error that ends the call: the
        retries used up, or a relay never reached within the connect budget (a wrong URL
        fails within it; a connect that timed out has used it up already)."""
        never = not self._reached and isinstance(exc, _CONNECT_FAILURES)
        left = self.connect_timeout - waited
        spent = never and (left <= 0 or isinstance(exc, httpx.ConnectTimeout))
        if attempt >= self.max_retries or spent:
            raise self._unreachable(exc, attempt + 1, never_reached=never) from exc
        delay = self._backoff(attempt)
        return min(delay, left) if never else delay

    def _relay_offers(self, feature: str) -> bool:
        """Whether /v1/info lists `feature` (asked once per client; False if it cannot be
        asked: an older relay, or one that is down, gets the cautious policy)."""
        try:
            features = self.known_info().features
        except SyncError as exc:
            log.info("relay %s: no /v1/info (%s); assuming no %s", self.base_url, exc, feature)
            return False
        return feature in features

    def _request(
        self,
        method: str,
        path: str,
        params: Mapping[str, str | int] | None,
        content: bytes | None,
        headers: Mapping[str, str] | None,
        max_bytes: int,
    ) -> httpx.Response:
        """One attempt: the answer with its body read under the size cap and deadline."""
        request = self._http.build_request(
            method, path, params=params, content=content, headers=headers
        )
        response = self._http.send(request, stream=True)
        try:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise self._too_large(method, path, max_bytes)
            deadline = time.monotonic() + ANSWER_DEADLINE_TIMEOUTS * self.timeout
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > max_bytes:
                    raise self._too_large(method, path, max_bytes)
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout(
                        f"the answer took longer than {ANSWER_DEADLINE_TIMEOUTS * self.timeout:g}"
                        " s to arrive",
                        request=request,
                    )
                chunks.append(chunk)
        finally:
            response.close()
        return httpx.Response(
            response.status_code,
            # the body is decoded already: drop what described its encoding on the wire
            headers=[
                (k, v)
                for k, v in response.headers.items()
                if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
            ],
            content=b"".join(chunks),
            request=request,
        )

    def _too_large(self, method: str, path: str, max_bytes: int) -> AnswerTooLargeError:
        return AnswerTooLargeError(
            one_line(
                f"the relay at {self.base_url} answered {method} {path} with more than "
                f"{max_bytes:,} bytes, more than any answer of an honest relay; the answer "
                "was dropped and nothing was applied: check the relay URL and the relay"
            ),
            max_bytes=max_bytes,
        )

    def _backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(backoff_max, backoff_base * 2**attempt)]."""
        cap = min(self.backoff_max, self.backoff_base * 2.0 ** min(attempt, 64))
        return self._rng.uniform(0.0, cap)

    def _body(self, response: httpx.Response) -> bytes:
        """The response body with any echo of the API key blanked out."""
        body = response.content
        if self._key_bytes:
            body = body.replace(self._key_bytes, _REDACTED)
        return body

    def _error(self, response: httpx.Response) -> SyncError:
        """The typed error for a non-retried error answer (3xx or 4xx)."""
        status = response.status_code
        if 300 <= status < 400:
            location = response.headers.get("location", "")
            where = f" to {location}" if location else ""
            return RelayError(
                status,
                f"http_{status}",
                one_line(
                    f"the relay at {self.base_url} redirects{where}; "
                    "configure the relay URL it redirects to"
                ),
            )
        return relay_error(status, self._body(response), retry_after=_retry_after(response.headers))

    def _gave_up(self, response: httpx.Response, attempts: int) -> SyncError:
        """The error after the last retry of a 429 or 5xx answer."""
        status = response.status_code
        error = relay_error(
            status, self._body(response), retry_after=_retry_after(response.headers)
        )
        if isinstance(error, RateLimitedError):
            return RateLimitedError(
                error.code,
                f"{error.message} (still rate limited after {attempts} attempts; "
                "wait a minute or ask the relay's operator for a higher rate)",
                retry_after=error.retry_after,
            )
        reason = (
            error.message if error.code != f"http_{status}" else body_excerpt(self._body(response))
        )
        return RelayUnavailableError(
            one_line(
                f"the relay at {self.base_url} could not serve the request: HTTP {status} "
                f"({reason}) after {attempts} attempts; try again later, and check the relay "
                "URL and the relay's status"
            ),
            url=self.base_url,
            status=status,
        )

    def _outcome_unknown(self, method: str, path: str, why: str, lost: str) -> OutcomeUnknownError:
        return OutcomeUnknownError(
            one_line(
                f"the relay at {self.base_url} did not answer {method} {path} ({why}) after "
                f"the request may have reached it, so it was not sent again: {lost}"
            ),
            url=self.base_url,
        )

    def _unreachable(
        self, exc: httpx.TransportError, attempts: int, *, never_reached: bool = False
    ) -> RelayUnavailableError:
        detail = one_line(str(exc)) or "no detail"
        if never_reached:  # issue 17: one line naming the URL and what to check
            return RelayUnavailableError(
                f"the relay at {self.base_url} could not be reached ({type(exc).__name__}: "
                f"{detail}) after {attempts} attempts within {self.connect_timeout:g} s; "
                "check the relay URL and your network (the URL's scheme, host and port, and "
                f"that the relay runs there; wait longer with {CONNECT_TIMEOUT_ENV}=SECONDS)",
                url=self.base_url,
            )
        return RelayUnavailableError(
            f"the relay at {self.base_url} could not be reached ({type(exc).__name__}: "
            f"{detail}) after {attempts} attempts; check the relay URL and your network",
            url=self.base_url,
        )


class EventStream:
    """An open event stream (RelayClient.events): its bytes, and a way to end it early."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    def chunks(self) -> Iterator[bytes]:
        """The raw bytes as they arrive; ends when the relay closes the stream."""
        return self._response.iter_raw()

    def abort(self) -> None:
        """Shut the connection down from another thread, so that a read blocked on it
        returns at once (closing the socket alone does not wake it on Linux)."""
        stream = self._response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _capped_answer(response: httpx.Response, request: httpx.Request, cap: int) -> httpx.Response:
    """An error answer of a streamed request with at most `cap` bytes of its body."""
    body = bytearray()
    try:
        for chunk in response.iter_raw():
            body += chunk[: cap - len(body)]
            if len(body) >= cap:
                break
    except httpx.HTTPError:
        pass  # what arrived is enough to name the error
    return httpx.Response(
        response.status_code,
        headers=[(k, v) for k, v in response.headers.items() if k.lower() == "retry-after"],
        content=bytes(body),
        request=request,
    )


def _not_processed(response: httpx.Response) -> bool:
    """A 429, or a 503 whose JSON `code` says the relay did nothing with the request."""
    if response.status_code == 429:
        return True
    if response.status_code != 503:
        return False
    try:
        code = response.json().get("code")
    except (ValueError, AttributeError):
        return False
    return code in NOT_PROCESSED


def _header_safe(value: str) -> bool:
    return bool(value) and value.isascii() and value.isprintable() and " " not in value


def _vault(vault_id: str) -> str:
    return f"/v1/vaults/{path_segment(vault_id)}"


def _display_url(url: httpx.URL) -> str:
    """The URL without any user:password part, safe to show."""
    return str(url.copy_with(userinfo=b"")) if url.userinfo else str(url)
