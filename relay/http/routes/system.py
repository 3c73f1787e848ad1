"""Health, readiness, limits, the generation and metrics (PROTOCOL §5, §11, §17)."""

from __future__ import annotations

import hmac
import time
from typing import Any

from litestar import MediaType, Request, Response, get

from engram_sync.relay import __version__
from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.errors import RelayError
from engram_sync.relay.services.config import RelayConfig
from engram_sync.shared_format.wire import MAX_BLOBS_PER_PUSH, MAX_PULL_LIMIT, RelayInfo, SyncHealth

PROTOCOL_VERSION = "engram-sync/5.1"
FEATURES = [
    "cursor",
    "device_bound_keys",
    "tombstone_compaction",
    "ready",
    "generation",
    "pull-origin",
    "vault-grants",  # PROTOCOL §13: /v1/vaults/{v}/grants (docs/vault-ownership.md)
    "grant-roles",  # PROTOCOL §13: grants carry a role, member or admin (vault-ownership.md)
    "digest",  # PROTOCOL §18: /v1/vaults/{v}/digest and /fetch (docs/digest.md)
    "digest-narrow",  # PROTOCOL §18, ours: POST /v1/vaults/{v}/digest/narrow (docs/digest.md)
    "digest-deep",  # PROTOCOL §18, ours: /digest?deep=1, computed from rows (docs/digest.md)
    "digest-carried",  # PROTOCOL §18, ours: `vault_digest` in push and pull answers (digest.md)
    "idempotency-keys",  # an Idempotency-Key makes creating POSTs retryable (docs/retries.md)
    "events",  # PROTOCOL §15: GET /v1/vaults/{v}/events (docs/live-feed.md)
    "events-blobs",  # ours: events?blobs=1, small commits' blobs in the change (docs/live-feed.md)
    "pull-wait",  # PROTOCOL §15: pull?cursor=N&wait=S, the long-poll
    "retire",  # PROTOCOL §19: POST /v1/vaults/{v}/retire (docs/rekey.md)
    "retire-undo",  # ours, §19 with §13: DELETE /v1/vaults/{v}/retire, the owner's undo
]


@get("/health", tags=["system"])
async def health(request: Request[Any, Any, Any]) -> SyncHealth:
    """Compatible counters from the background cache: no database round trip (§11)."""
    state = relay_state(request)
    return SyncHealth(
        status="ok",
        version=__version__,
        uptime_secs=int(time.monotonic() - state.started),
        vaults=state.health.vaults,
        total_blobs=state.health.total_blobs,
        db_size_bytes=state.health.db_size_bytes,
    )


@get("/ready", tags=["system"])
async def ready(request: Request[Any, Any, Any]) -> dict[str, str]:
    """200 only when the database answers; 503 with Retry-After otherwise (§11)."""
    state = relay_state(request)
    try:
        async with state.require_pool().acquire(timeout=2) as conn:
            await conn.fetchval("SELECT 1", timeout=2)
    except Exception:  # any failure to reach the database means "not ready"
        raise RelayError(
            503,
            "unavailable",
            "the relay's database does not answer",
            headers={"Retry-After": "2"},
        ) from None
    return {"status": "ready"}


def features_of(config: RelayConfig) -> list[str]:
    """FEATURES without the live feed's parts that ENGRAM_RELAY_LIVE_FEED turned off."""
    off: set[str] = set()
    if not config.feed_events:
        off.update(("events", "events-blobs"))
    if not config.feed_notify:
        off.add("pull-wait")
    return [name for name in FEATURES if name not in off]


@get("/v1/info", tags=["system"])
async def info(request: Request[Any, Any, Any]) -> RelayInfo:
    """The limits advertisement, so clients size batches without guessing (§11)."""
    state = relay_state(request)
    config = state.config
    return RelayInfo(
        protocol=PROTOCOL_VERSION,
        max_blobs_per_push=MAX_BLOBS_PER_PUSH,
        max_blob_bytes=config.max_blob_bytes,
        max_pull_limit=MAX_PULL_LIMIT,
        max_body_bytes=config.max_body_bytes,
        features=features_of(config),
        max_page_bytes=config.max_page_bytes,  # PROTOCOL §11, additive
        generation=state.generation,  # PROTOCOL §17
    )


def _metrics_token_matches(request: Request[Any, Any, Any], token: str) -> bool:
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    # hmac.compare_digest: the time taken does not depend on how much of the token matched.
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


@get("/metrics", tags=["system"], media_type=MediaType.TEXT)
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Prometheus text exposition, for `Authorization: Bearer <ENGRAM_RELAY_METRICS_TOKEN>`
    only: 401 without it, 404 while no token is configured (issue 14 item 16)."""
    state = relay_state(request)
    token = state.config.metrics_token
    if token is None:
        raise RelayError(
            404,
            "not_found",
            "this relay serves no metrics: its operator sets ENGRAM_RELAY_METRICS_TOKEN "
            "to turn /metrics on",
        )
    if not _metrics_token_matches(request, token):
        raise RelayError(
            401,
            "unauthorized",
            "missing or wrong metrics token: send `Authorization: Bearer <token>` with the "
            "relay's ENGRAM_RELAY_METRICS_TOKEN",
            headers={"WWW-Authenticate": "Bearer"},
        )
    body = state.metrics.render()
    return Response(content=body, media_type="text/plain; version=0.0.4; charset=utf-8")
