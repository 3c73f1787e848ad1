"""The relay's ASGI application (Litestar)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any

from litestar import Litestar, Request
from litestar.config.app import AppConfig
from litestar.datastructures import State
from litestar.enums import ScopeType
from litestar.openapi import OpenAPIConfig
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from engram_sync.relay import __version__
from engram_sync.relay.db.pool import create_pool
from engram_sync.relay.domain.stream_holders import StreamHolders
from engram_sync.relay.http.bodies import document_api
from engram_sync.relay.http.errors import EXCEPTION_HANDLERS, RelayError
from engram_sync.relay.http.routes import (
    accounts,
    devices,
    events,
    grants,
    handoff,
    pairing,
    passkeys,
    retire,
    retire_undo,
    sync,
    system,
    vault_passkeys,
    web_vault,
)
from engram_sync.relay.http.routes.digest import digest as digest_route
from engram_sync.relay.http.routes.digest import fetch as fetch_route
from engram_sync.relay.http.routes.digest import narrow as narrow_route
from engram_sync.relay.services import maintenance
from engram_sync.relay.services.change_hub import ChangeHub
from engram_sync.relay.services.config import RelayConfig
from engram_sync.relay.services.feed_listener import FeedListener
from engram_sync.relay.services.metrics import RelayMetrics
from engram_sync.relay.services.push_groups import PushGroups
from engram_sync.relay.services.scan_gate import ScanGate
from engram_sync.relay.services.state import RelayState
from engram_sync.relay.serving.lean_app import LeanLitestar
from engram_sync.relay.serving.request_context import request_id_middleware
from engram_sync.relay.store.meta import read_generation
from engram_sync.relay.store.push import (
    PushJob,
    PushLimits,
    PushResult,
    Quota,
    plain_postgres,
    push_group,
)
from engram_sync.relay.store.replicas import Replica, heartbeat, leave
from engram_sync.shared_format.wire import MAX_BLOBS_PER_PUSH

log = logging.getLogger(__name__)
access_log = logging.getLogger("engram_sync.relay.access")

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
MAX_GROUP_BLOBS = 2 * MAX_BLOBS_PER_PUSH  # blobs of one group commit (relay.services.push_groups)


def _content_type_guard(app: ASGIApp) -> ASGIApp:
    """415 for a body that is not JSON (PROTOCOL §5), before any parsing happens."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == ScopeType.HTTP and scope.get("method") in _BODY_METHODS:
            headers = dict(scope["headers"])
            content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            has_body = headers.get(b"content-length", b"0") != b"0" or (
                b"transfer-encoding" in headers
            )
            if has_body and content_type != b"application/json":
                raise RelayError(
                    415,
                    "unsupported_media_type",
                    "request bodies must be JSON: send `Content-Type: application/json`",
                )
        await app(scope, receive, send)

    return middleware


def _timing(app: ASGIApp) -> ASGIApp:
    """Count and time every request by route template (never by vault id)."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await app(scope, receive, send_wrapper)
        finally:
            metrics: RelayMetrics = scope["app"].state.relay.metrics
            route = scope.get("path_template") or "unmatched"
            method = str(scope.get("method", ""))
            elapsed = time.perf_counter() - started
            metrics.requests.labels(route, method, str(status)).inc()
            metrics.latency.labels(route, method).observe(elapsed)
            state = scope.get("state") or {}
            access_log.info(
                "%s %s %d %.1fms",
                method,
                route,
                status,
                elapsed * 1000,
                extra={
                    "method": method,
                    "route": route,
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 2),
                    "key_prefix": state.get("key_prefix"),
                },
            )

    return middleware


async def _refresh_health(state: RelayState) -> None:
    """Keep the /health counters, the generation and the live relay processes fresh without
    a database round trip per request."""
    replica = Replica(state.config.health_refresh_secs)  # issue 18 (relay.store.replicas)
    try:
        await _refresh_rounds(state, replica)
    finally:  # stopped with the app: the others count one process fewer at once
        with contextlib.suppress(Exception):
            await asyncio.wait_for(leave(state.require_pool(), replica), 2)


async def _refresh_rounds(state: RelayState, replica: Replica) -> None:
    while True:
        try:
            async with state.require_pool().acquire() as conn:
                # The per-vault counts the pushes keep (0003_vault_counts): a scan of
                # the vaults, never of the blobs, which stalled pushes on a large relay.
                # PROTOCOL §17: the generation is read with them, so a restore reaches every
                # replica within one refresh period.
                # Two statements: Citus cannot push a subquery on relay_meta down
                # into the aggregate over the distributed vaults (deploy/SCALING.md §3).
                row = await conn.fetchrow(
                    "SELECT count(*) AS vaults, coalesce(sum(live_blobs), 0) AS live,"
                    " coalesce(sum(tombstones), 0) AS tombstones,"
                    " pg_database_size(current_database()) AS size FROM vaults"
                )
                generation = await conn.fetchval("SELECT generation FROM relay_meta")
                # Issue 18: each key's rate shared among the live processes
                # (relay.domain.ratelimit).
                processes = await heartbeat(conn, replica)
            state.limiter.share_among(processes)
            state.minute_limiter.share_among(processes)
            state.metrics.relay_processes.set(processes)
            if generation is not None:
                state.generation = generation
            state.health.vaults = int(row["vaults"])
            state.health.total_blobs = int(row["live"])
            state.health.db_size_bytes = int(row["size"])
            state.metrics.vaults.set(state.health.vaults)
            state.metrics.live_blobs.set(state.health.total_blobs)
            state.metrics.tombstones.set(int(row["tombstones"]))
            # with --workers N, each worker's pool (relay.services.metrics)
            state.metrics.refresh_pool()
        except Exception as exc:  # the database may be down; /ready reports that
            log.warning("health refresh failed: %s", type(exc).__name__)
        await asyncio.sleep(state.config.health_refresh_secs)


def create_app(config: RelayConfig) -> Litestar:
    """Build the relay app; the pool opens at startup and closes at shutdown."""
    state = _relay_state(config)

    def on_app_init(app_config: AppConfig) -> AppConfig:
        app_config.state = State({"relay": state})
        return app_config

    app = LeanLitestar(  # issue 36: no pydantic or attrs plugin (relay.serving.lean_app)
        route_handlers=_routes(config),
        lifespan=[_lifespan(state)],
        on_app_init=[on_app_init],
        middleware=[request_id_middleware, _timing, _content_type_guard],
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        request_max_body_size=config.max_body_bytes,
        openapi_config=OpenAPIConfig(title="Engram Sync relay", version=__version__),
        logging_config=None,
        debug=False,
    )
    document_api(app)
    return app


def _relay_state(config: RelayConfig) -> RelayState:
    """The process's state: keys, the change hub, stream and scan bounds, push groups."""
    state = RelayState(config=config, metrics=RelayMetrics())
    state.static_keys = {k.key_hash: k.principal for k in config.static_keys}
    hub = state.hub = ChangeHub(max_waiters=config.events_max_streams)
    state.holders = StreamHolders(config.stream_caps)
    state.scans = ScanGate(config.scan_limits, config.scan_timeout_s)
    state.push_limits = PushLimits(
        config.max_blob_bytes,
        Quota(config.quota_devices, config.quota_bytes),
        announce=config.feed_notify,  # ENGRAM_RELAY_LIVE_FEED=off: no NOTIFY (PROTOCOL §15)
        # this process's waiters, at once after the commit (before the NOTIFY)
        published=hub.publish_commits if config.feed_notify else None,
    )

    async def run_group(
        jobs: list[PushJob], committed: Callable[[list[PushResult]], None]
    ) -> list[PushResult]:
        state.metrics.push_group_size.observe(len(jobs))
        limits = state.push_limits
        assert limits is not None
        # the pushes answered at the commit, the NOTIFYs after it
        return await push_group(state.require_pool(), jobs, limits, committed)

    state.push_groups = PushGroups(
        run_group,
        lanes=config.lanes_in_use,
        max_group_blobs=MAX_GROUP_BLOBS,
    )
    return state


def _lifespan(state: RelayState) -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the pool and the generation before the first answer, then the
    health refresher, maintenance and the feed's LISTEN beside the serving."""
    config = state.config

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        state.pool = await create_pool(
            config.database_url, min_size=config.pool_min_size, max_size=config.pool_max_size
        )
        pool = state.pool
        # PROTOCOL §17: known before the first answer, so every answer carries it.
        try:
            async with pool.acquire() as conn:
                state.generation = await read_generation(conn)
                # issue 36: a push in fewer round trips, where the database allows it
                one_statement = await plain_postgres(conn)
                if state.push_limits is not None:
                    state.push_limits = replace(state.push_limits, one_statement=one_statement)
        except BaseException:
            await pool.close()
            raise
        state.metrics.watch_pool(
            lambda: (pool.get_size(), pool.get_idle_size(), pool.get_max_size())
        )
        refresher = asyncio.create_task(_refresh_health(state))
        maintainer = maintenance.start(state)  # issue 14 item 17: compaction without `gc`
        listener = FeedListener(config.listen_url, state.require_hub())  # §15: one per process
        if config.feed_notify:
            listener.start()
        try:
            yield
        finally:
            await listener.stop()
            await maintenance.stop(maintainer)
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
            await pool.close()

    return lifespan


def _routes(config: RelayConfig) -> list[Any]:
    """Every route of the relay; the event stream only where the live feed serves it."""
    return [
        sync.push,
        sync.pull,
        sync.stats,
        sync.stats_alias,
        digest_route,  # PROTOCOL §18
        narrow_route,
        fetch_route,
        *([events.events] if config.feed_events else []),  # PROTOCOL §15
        devices.list_devices,
        devices.register_device,
        devices.revoke_device,
        system.health,
        system.ready,
        system.info,
        system.metrics,
        *accounts.ROUTES,  # PROTOCOL §13
        *passkeys.ROUTES,  # §13 passkey wraps (docs/web-vault.md)
        *vault_passkeys.ROUTES,  # the same for passphrase vaults, under a vault key
        *pairing.ROUTES,
        *handoff.ROUTES,  # PROTOCOL §14
        *grants.ROUTES,  # PROTOCOL §13 vault ownership
        *retire.ROUTES,  # PROTOCOL §19
        *retire_undo.ROUTES,  # PROTOCOL §19 with §13: the owner's undo
        # issue 34: the web vault's bundle at /vault/ (ENGRAM_RELAY_WEB_VAULT=0: none)
        *(web_vault.routes(config.web_vault_dir) if config.web_vault else []),
    ]


def request_key_prefix(request: Request[Any, Any, Any]) -> str | None:
    """The authenticated key's display prefix, for logs."""
    prefix: str | None = getattr(request.state, "key_prefix", None)
    return prefix
